"""The fused encoder computes its projections, feed-forward and LayerNorms on real tokens
only (`keras_attn_export.unpad`): the same values at real positions, zeros at padding, and
every per-position operator runs on N rows, N the real tokens of the batch."""

import json

import keras
import numpy as np
import onnx
import pytest
from keras_attn_export import export_model
from keras_attn_export.compare import at_real_positions
from keras_attn_export.onnx import run_onnx
from keras_attn_export.optimize import fuse, padding_rule

from keras_attn.models import Encoder

pytestmark = pytest.mark.tf_only

# Right-padded rows of 5, 2 and 5 real tokens, a full row, and a row of padding alone.
IDS = np.array(
    [[2, 9, 12, 7, 5, 0, 0], [4, 1, 0, 0, 0, 0, 0], [3, 3, 8, 8, 3, 0, 0],
     [5, 6, 7, 8, 9, 10, 11], [0, 0, 0, 0, 0, 0, 0]], "int32",
)  # fmt: skip
REAL = IDS != 0
PER_POSITION = {"MatMul", "SkipLayerNormalization", "Gelu", "BiasGelu", "FusedMatMul"}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    keras.utils.set_random_seed(0)
    encoder = Encoder(50, 16, hidden_dim=16, num_layers=2, num_heads=2, activation="gelu",
                      dropout=0.0)  # fmt: skip
    folder = tmp_path_factory.mktemp("enc")
    manifest = export_model(encoder, folder, formats=["onnx"], optimize=True, verbose=False)
    return encoder, folder, manifest


def _session(path, profile=None):
    import onnxruntime as ort

    options = ort.SessionOptions()
    if profile is not None:
        options.enable_profiling = True
        options.profile_file_prefix = str(profile)
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _feeds(ids):
    return {"token_ids": ids, "segment_ids": (ids > 6).astype("int32")}


def test_real_positions_equal_keras_and_padding_is_zero(exported, tmp_path):
    encoder, folder, manifest = exported
    assert manifest["onnx"]["file"] == "model.opt.onnx"  # the graph the server runs
    assert manifest["onnx"]["unpadded"]["model.opt.onnx"].model_dump() == {
        "input": "token_ids", "pad_value": 0
    }  # fmt: skip
    expected = encoder(_feeds(IDS))
    got = run_onnx(_session(folder / "model.opt.onnx"), _feeds(IDS))
    padded = tmp_path / "padded.onnx"  # the same fusion, padding computed
    onnx.save(fuse(onnx.load(folder / "model.onnx"), unpad=False), padded)
    reference = run_onnx(_session(padded), _feeds(IDS))
    sequence = np.asarray(expected["sequence_output"])
    np.testing.assert_allclose(got["sequence_output"][REAL], sequence[REAL], atol=1e-5)
    np.testing.assert_allclose(got["sequence_output"][REAL], reference["sequence_output"][REAL],
                               atol=1e-6)  # fmt: skip
    assert not got["sequence_output"][~REAL].any()  # zeros; Keras has numbers there
    assert np.abs(sequence[~REAL]).min() > 0
    # The [CLS] pooler reads position 0: equal wherever it is real (right padding).
    np.testing.assert_allclose(got["pooled_output"][:4], expected["pooled_output"][:4], atol=1e-5)


def test_per_position_operators_run_on_the_real_tokens_alone(exported, tmp_path):
    _, folder, _ = exported
    session = _session(folder / "model.opt.onnx", profile=tmp_path / "profile")
    session.run(None, _feeds(IDS))
    events = json.loads(open(session.end_profiling()).read())
    shapes: dict[str, list] = {}
    for event in events:
        args = event.get("args", {})
        if event.get("cat") == "Node" and "input_type_shape" in args:
            first = next(iter(args["input_type_shape"][0].values()))
            shapes.setdefault(args["op_name"], []).append(first)
    real = int(REAL.sum())
    assert real == 19  # of 35 positions
    ran = [(op, shape) for op, rows in shapes.items() if op in PER_POSITION for shape in rows]
    # 2 blocks: q/k/v are packed into Attention; the attention output projection and 2 FFN
    # matmuls per block (onnxruntime may fuse some into FusedMatMul), 2 LayerNorms per block;
    # the pooler's matmul takes one row per sequence.
    per_position = [(op, shape) for op, shape in ran if len(shape) == 3]
    assert [shape for _, shape in ran if len(shape) != 3] == [[5, 16]]
    assert sum(op == "SkipLayerNormalization" for op, _ in per_position) == 4
    assert sum(op != "SkipLayerNormalization" for op, _ in per_position) >= 6
    for op, shape in per_position:
        assert shape[:2] == [1, real], (op, shape)
    # Attention alone sees the padded (B, T) layout.
    assert shapes["Attention"] == [[*IDS.shape, 16]] * 2


def test_a_batch_of_padding_alone_runs(exported):
    _, folder, _ = exported
    ids = np.zeros((3, 4), "int32")
    got = run_onnx(_session(folder / "model.opt.onnx"), _feeds(ids))
    assert got["sequence_output"].shape == (3, 4, 16) and not got["sequence_output"].any()


def test_padding_rule_names_the_input_and_pad_value(exported):
    _, folder, _ = exported
    assert padding_rule(onnx.load(folder / "model.opt.onnx")) == {
        "input": "token_ids", "pad_value": 0
    }  # fmt: skip
    assert padding_rule(onnx.load(folder / "model.onnx")) is None


def test_at_real_positions_picks_per_position_outputs():
    feeds = {"token_ids": np.array([[3, 4, 0], [5, 0, 0]])}
    rule = {"input": "token_ids", "pad_value": 0}
    sequence = np.arange(12.0).reshape(2, 3, 2)
    got, want = at_real_positions(feeds, rule, sequence, sequence + 1)
    np.testing.assert_array_equal(got, [[0, 1], [2, 3], [6, 7]])
    np.testing.assert_array_equal(want, [[1, 2], [3, 4], [7, 8]])
    pooled = np.ones((2, 2))  # one value per row: compared whole
    assert at_real_positions(feeds, rule, pooled, pooled)[0].shape == (2, 2)
    assert at_real_positions(feeds, None, sequence, sequence)[0].shape == (2, 3, 2)
