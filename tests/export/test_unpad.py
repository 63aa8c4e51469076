"""The fused encoder computes its projections, feed-forward and LayerNorms on real tokens
only (`keras_attn_export.unpad`): the same values at real positions, zeros at padding, and
every per-position operator runs on N rows, N the real tokens of the batch."""

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from keras_attn_export import qkv_switch
from keras_attn_export.compare import at_real_positions
from keras_attn_export.onnx import run_onnx
from keras_attn_export.optimize import fuse, padding_rule

pytestmark = pytest.mark.tf_only

# Right-padded rows of 5, 2 and 5 real tokens, a full row, a row of padding alone and a
# left-padded row.
IDS = np.array(
    [[2, 9, 12, 7, 5, 0, 0], [4, 1, 0, 0, 0, 0, 0], [3, 3, 8, 8, 3, 0, 0],
     [5, 6, 7, 8, 9, 10, 11], [0, 0, 0, 0, 0, 0, 0], [0, 0, 8, 8, 3, 4, 6]], "int32",
)  # fmt: skip
REAL = IDS != 0
KEPT = REAL | (np.arange(IDS.shape[1]) == 0)  # each row's first position too
PER_POSITION = {"MatMul", "SkipLayerNormalization", "Gelu", "BiasGelu", "FusedMatMul"}


@pytest.fixture(scope="module")
def exported(fused_encoder):
    return fused_encoder  # tests/export/conftest.py


def _session(path, profile=None):
    import onnxruntime as ort

    options = ort.SessionOptions()
    if profile is not None:
        options.enable_profiling = True
        options.profile_file_prefix = str(profile)
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _feeds(ids):
    return {"token_ids": ids, "segment_ids": (ids > 6).astype("int32")}


def _profiled_shapes(session, feeds):
    """`{op: [first input's shape, ...]}` of one profiled run."""
    session.run(None, feeds)
    shapes: dict[str, list] = {}
    for event in json.loads(Path(session.end_profiling()).read_text()):
        args = event.get("args", {})
        if event.get("cat") == "Node" and "input_type_shape" in args:
            first = next(iter(args["input_type_shape"][0].values()))
            shapes.setdefault(args["op_name"], []).append(first)
    return shapes


def _forced(folder, tmp_path, qkv):
    """`model.opt.onnx` with its q/k/v branch forced (`keras_attn_export.qkv_switch`)."""
    share = {"packed": qkv_switch.NEVER, "unpadded": qkv_switch.ALWAYS}[qkv]
    path = tmp_path / f"{qkv}.onnx"
    onnx.save(qkv_switch.with_threshold(onnx.load(folder / "model.opt.onnx"), share), path)
    return path


@pytest.mark.parametrize("qkv", ["packed", "unpadded"])
def test_real_positions_equal_keras_and_padding_is_zero(exported, tmp_path, qkv):
    encoder, folder, manifest = exported
    assert manifest["onnx"]["file"] == "model.opt.onnx"  # the graph the server runs
    assert manifest["onnx"]["unpadded"]["model.opt.onnx"].model_dump() == {
        "input": "token_ids", "pad_token_id": 0, "outputs": ["sequence_output"]
    }  # fmt: skip
    expected = encoder(_feeds(IDS))
    got = run_onnx(_session(_forced(folder, tmp_path, qkv)), _feeds(IDS))
    padded = tmp_path / "padded.onnx"  # the same fusion, padding computed
    onnx.save(fuse(onnx.load(folder / "model.onnx"), unpad=False), padded)
    reference = run_onnx(_session(padded), _feeds(IDS))
    sequence = np.asarray(expected["sequence_output"])
    np.testing.assert_allclose(got["sequence_output"][KEPT], sequence[KEPT], atol=1e-5)
    np.testing.assert_allclose(got["sequence_output"][KEPT], reference["sequence_output"][KEPT],
                               atol=1e-6)  # fmt: skip
    assert not got["sequence_output"][~KEPT].any()  # zeros; Keras has numbers there
    assert np.abs(sequence[~KEPT]).min() > 0
    # The [CLS] pooler reads position 0, kept in every row: equal to Keras in each, with
    # left padding and in a row of padding alone too.
    np.testing.assert_allclose(got["pooled_output"], expected["pooled_output"], atol=1e-5)


def test_per_position_operators_run_on_the_real_tokens_alone(exported, tmp_path):
    _, folder, _ = exported
    session = _session(_forced(folder, tmp_path, "packed"), profile=tmp_path / "profile")
    shapes = _profiled_shapes(session, _feeds(IDS))
    real = int(KEPT.sum())
    assert real == 26  # of 42 positions: 24 real, and the first of 2 rows that start padded
    ran = [(op, shape) for op, rows in shapes.items() if op in PER_POSITION for shape in rows]
    # 2 blocks: q/k/v are packed into Attention; the attention output projection and 2 FFN
    # matmuls per block (onnxruntime may fuse some into FusedMatMul), 2 LayerNorms per block;
    # the pooler's matmul takes one row per sequence.
    per_position = [(op, shape) for op, shape in ran if len(shape) == 3]
    assert [shape for _, shape in ran if len(shape) != 3] == [[6, 16]]
    assert sum(op == "SkipLayerNormalization" for op, _ in per_position) == 4
    assert sum(op != "SkipLayerNormalization" for op, _ in per_position) >= 6
    for op, shape in per_position:
        assert shape[:2] == [1, real], (op, shape)
    # Attention alone sees the padded (B, T) layout.
    assert shapes["Attention"] == [[*IDS.shape, 16]] * 2


@pytest.mark.parametrize("qkv", ["packed", "unpadded"])
def test_a_batch_of_padding_alone_keeps_each_rows_first_position(exported, tmp_path, qkv):
    encoder, folder, _ = exported
    ids = np.zeros((3, 4), "int32")
    got = run_onnx(_session(_forced(folder, tmp_path, qkv)), _feeds(ids))
    expected = encoder(_feeds(ids))
    assert got["sequence_output"].shape == (3, 4, 16) and not got["sequence_output"][:, 1:].any()
    np.testing.assert_allclose(got["sequence_output"][:, 0], expected["sequence_output"][:, 0],
                               atol=1e-5)  # fmt: skip
    np.testing.assert_allclose(got["pooled_output"], expected["pooled_output"], atol=1e-5)


def test_padding_rule_names_the_input_and_pad_value(exported):
    _, folder, _ = exported
    assert padding_rule(onnx.load(folder / "model.opt.onnx")) == {
        "input": "token_ids", "pad_token_id": 0, "outputs": ["sequence_output"]
    }  # fmt: skip
    assert padding_rule(onnx.load(folder / "model.onnx")) is None


def test_at_real_positions_compares_the_named_outputs_where_kept():
    feeds = {"token_ids": np.array([[3, 4, 0], [0, 5, 0]])}
    rule = {"input": "token_ids", "pad_token_id": 0, "outputs": ["sequence_output"]}
    sequence = np.arange(12.0).reshape(2, 3, 2)
    got, want = at_real_positions(feeds, rule, "sequence_output", sequence, sequence + 1)
    # Row 0: positions 0 and 1; row 1: position 1, and position 0 (each row's first is kept).
    np.testing.assert_array_equal(got, [[0, 1], [2, 3], [6, 7], [8, 9]])
    np.testing.assert_array_equal(want, got + 1)
    # Choices merged into the batch: the input is (B, C, T), the output (B * C, T, width).
    merged = {"token_ids": feeds["token_ids"][None]}
    np.testing.assert_array_equal(at_real_positions(merged, rule, "sequence_output", sequence,
                                                    sequence)[0], got)  # fmt: skip
    # An output the rule does not name is compared whole, even shaped (B, T) by chance.
    square = np.ones((2, 3))
    assert at_real_positions(feeds, rule, "pooled_output", square, square)[0].shape == (2, 3)
    assert at_real_positions(feeds, None, "sequence_output", sequence, sequence)[0].shape == (
        2, 3, 2
    )  # fmt: skip


def test_the_server_runs_the_unpadded_graph_and_merges_lengths_exactly(exported, tmp_path):
    import shutil

    from keras_attn_serving.repository import ModelRepository

    encoder, folder, _ = exported
    shutil.copytree(folder, tmp_path / "enc" / "1")
    repository = ModelRepository(tmp_path, max_batch_size=8)
    _, predictor, batcher = repository.batcher("enc")
    assert predictor.session._model_path.endswith("model.opt.onnx")
    # Rows of 2 to 7 tokens merged into batches padded to their longest: each answer equals
    # Keras on that row alone, at every position it has.
    rows = [row[row != 0] for row in IDS if row[0] != 0]
    futures = [batcher.submit(_feeds(row[None])) for row in rows]
    for row, future in zip(rows, futures, strict=True):
        got = future.result(timeout=60)
        alone = encoder(_feeds(row[None]))
        np.testing.assert_allclose(got["sequence_output"], alone["sequence_output"], atol=1e-5)
        np.testing.assert_allclose(got["pooled_output"], alone["pooled_output"], atol=1e-5)
    repository.close()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["classifier_mean", "span_qa", "multiple_choice"])
def test_heads_that_mask_or_merge_choices_skip_padding_too(name, tmp_path):
    """Mean pooling and span logits multiply by the padding mask, so they read zeros where
    Keras has numbers and get Keras's result; multiple choice merges its choices into the
    batch. Each head's outputs equal Keras's and the padded graph's, rows of padding alone
    and left padding included, while its matmuls run on the kept tokens alone."""
    from keras_attn_export import export_model

    from tests.models.model_cases import build

    model = build(name)[0]
    manifest = export_model(model, tmp_path, formats=["onnx"], optimize=True, verbose=False)
    assert manifest["onnx"]["unpadded"]["model.opt.onnx"].model_dump() == {
        "input": "token_ids", "pad_token_id": 0, "outputs": []
    }  # fmt: skip
    ids = IDS.reshape(2, 3, 7) if name == "multiple_choice" else IDS
    feeds = {"token_ids": ids, "segment_ids": (ids > 6).astype("int32")}
    expected = {k: np.asarray(v) for k, v in model(feeds).items()} if name == "span_qa" else {
        "logits": np.asarray(model(feeds))
    }  # fmt: skip
    session = _session(tmp_path / "model.opt.onnx", profile=tmp_path / "profile")
    got = run_onnx(session, feeds)
    padded = tmp_path / "padded.onnx"
    onnx.save(fuse(onnx.load(tmp_path / "model.onnx"), unpad=False), padded)
    reference = run_onnx(_session(padded), feeds)
    rows = slice(None) if name != "classifier_mean" else REAL.any(axis=1)  # 0 / 0 without any
    for key, want in expected.items():
        np.testing.assert_allclose(got[key][rows], want[rows], atol=1e-5)
        np.testing.assert_allclose(got[key], reference[key], atol=1e-6, equal_nan=True)
    real = int(KEPT.sum())
    matmuls = [s for op, runs in _profiled_shapes(session, feeds).items()
               if op in ("MatMul", "FusedMatMul") for s in runs]  # fmt: skip
    assert [1, real] in [s[:2] for s in matmuls], matmuls  # the FFN, on 26 of 42 positions
    assert not [s for s in matmuls if len(s) == 3 and s[:2] == list(IDS.shape)], matmuls
