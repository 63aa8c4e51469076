"""The padding-free encoder picks its q/k/v projection per batch by padding share
(`keras_attn_export.qkv_switch`): packed in `Attention` on the padded layout, or on the real
tokens alone. Each branch equals Keras, the `If` takes the one its threshold names, the
threshold is the one measured at export, and the export's parity check runs both."""

import numpy as np
import onnx
import pytest
from keras_attn_export import ParityError, export_model, qkv_switch
from keras_attn_export.onnx import run_onnx
from keras_attn_export.optimize import fuse, padding_rule

from tests.export.test_unpad import IDS, _feeds, _profiled_shapes

pytestmark = pytest.mark.tf_only

SHARE = 18 / 42  # of IDS's 42 positions, 18 are padding


def _attention_ops(session, feeds):
    """`{op: times run}` of the attention operators in one profiled run."""
    shapes = _profiled_shapes(session, feeds)
    return {op: len(shapes[op]) for op in ("Attention", "MultiHeadAttention") if op in shapes}


def test_the_manifest_records_the_measured_threshold_and_each_branchs_operators(fused_encoder):
    _, folder, manifest = fused_encoder
    record = manifest["onnx"]["qkv_switch"]["model.opt.onnx"].model_dump()
    assert record["chosen_by"] == "measurement"
    shares = [t["padding"] for t in record["timings"]]
    assert 0.5 <= shares[0] < 0.6 and 0.7 < shares[1] < 0.8 and len(shares) == 2
    # The threshold is the one its own timings give, and the one the graph holds.
    assert record["threshold"] == qkv_switch.choose(record["timings"])
    graph = onnx.load(folder / "model.opt.onnx")
    assert qkv_switch.threshold(graph) == pytest.approx(record["threshold"], abs=1e-6)
    # `fused_ops` counts the packed branch; the record, the other: the same LayerNorms and
    # GELUs, and each block's packed `Attention` as a `MultiHeadAttention`.
    shared = {"EmbedLayerNormalization": 1, "SkipLayerNormalization": 4, "Gelu": 2}
    assert manifest["onnx"]["fused_ops"]["model.opt.onnx"] == {**shared, "Attention": 2}
    assert record["unpadded_fused_ops"] == {**shared, "MultiHeadAttention": 2}
    assert padding_rule(graph) == manifest["onnx"]["unpadded"]["model.opt.onnx"].model_dump()


def test_the_branches_share_their_weights(fused_encoder):
    _, folder, _ = fused_encoder
    model = onnx.load(folder / "model.onnx")
    packed = fuse(model)
    unpadded = fuse(model, pack_qkv=False)

    def weight_bytes(m):
        return sum(onnx.numpy_helper.to_array(t).nbytes for t in m.graph.initializer)

    switched = onnx.load(folder / "model.opt.onnx")
    # Only what the two hold differently is stored twice (at most q, k and v of each block:
    # 2 x 3 x 16 x 16 floats and their biases).
    assert weight_bytes(switched) <= weight_bytes(packed) + 2 * 3 * (16 * 16 + 16) * 4 + 64
    assert weight_bytes(switched) < weight_bytes(packed) + weight_bytes(unpadded) - 8000
    # The outer graph holds the weights, the padding share and the If alone.
    ops = [n.op_type for n in switched.graph.node]
    assert ops == ["Equal", "Cast", "ReduceMean", "Greater", "If"]


@pytest.mark.parametrize(("threshold", "ran"), [(SHARE - 0.01, "MultiHeadAttention"),
                                                (SHARE + 0.01, "Attention")])  # fmt: skip
def test_the_switch_runs_the_branch_its_threshold_names(fused_encoder, tmp_path, threshold, ran):
    import onnxruntime as ort

    encoder, folder, _ = fused_encoder
    path = tmp_path / "model.onnx"
    onnx.save(qkv_switch.with_threshold(onnx.load(folder / "model.opt.onnx"), threshold), path)
    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(tmp_path / "profile")
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    assert _attention_ops(session, _feeds(IDS)) == {ran: 2}  # one per block
    got = run_onnx(session, _feeds(IDS))
    expected = np.asarray(encoder(_feeds(IDS))["sequence_output"])
    real = (IDS != 0) | (np.arange(IDS.shape[1]) == 0)
    np.testing.assert_allclose(got["sequence_output"][real], expected[real], atol=1e-5)


def test_the_threshold_is_where_unpadded_q_k_v_stop_costing():
    def timings(*ratios):  # packed ÷ unpadded at 50, 62.5 and 75% padding
        return [{"padding": share, "packed_ms": 100.0 * r, "unpadded_ms": 100.0}
                for share, r in zip((0.5, 0.625, 0.75), ratios, strict=True)]  # fmt: skip

    # MiniLM-L6 on a 2-core Xeon (bench/unpad.py): 1.01x at 50%, 1.08x at 80%.
    assert qkv_switch.choose(timings(1.01, 1.04, 1.08)) == 0.5
    assert qkv_switch.choose(timings(0.99, 1.04, 1.08)) == 0.625  # slower at half padding
    assert qkv_switch.choose(timings(1.01, 0.99, 1.08)) == 0.75  # the lightest from which on
    # Not 2% faster at the heaviest share: never (2% is noise on two cores).
    assert qkv_switch.choose(timings(1.05, 1.05, 1.02)) == qkv_switch.NEVER
    assert qkv_switch.choose(timings(0.9, 0.95, 0.97)) == qkv_switch.NEVER
    assert qkv_switch.choose(timings(1.0, 1.0, 1.03)) == 0.5


def test_graphs_with_other_inputs_or_outputs_are_not_switched(fused_encoder):
    _, folder, _ = fused_encoder
    model = onnx.load(folder / "model.onnx")
    packed, unpadded = fuse(model), fuse(model, pack_qkv=False)
    rule = padding_rule(packed)
    assert qkv_switch.switch(packed, unpadded, rule) is not None
    unpadded.graph.output[0].name = "renamed"
    assert qkv_switch.switch(packed, unpadded, rule) is None
    assert qkv_switch.switch(packed, packed, {**rule, "input": "no_such_input"}) is None
    assert qkv_switch.find(packed) is None and qkv_switch.threshold(packed) is None


def test_export_parity_runs_the_unpadded_branch_too(monkeypatch, tmp_path):
    """A wrong unpadded branch fails the export even where the threshold never runs it on
    the parity sweep's batches."""
    import keras

    from keras_attn.models import Encoder

    original = qkv_switch.switch

    def wrong_unpadded(packed, unpadded, rule, threshold=0.5):
        for tensor in unpadded.graph.initializer:  # one (16, n) weight of the unpadded branch
            array = onnx.numpy_helper.to_array(tensor)
            if array.ndim == 2 and array.dtype == np.float32 and array.shape[0] == 16:
                # Scaled: adding a constant would change nothing after a LayerNorm (its
                # outputs sum to zero).
                tensor.CopyFrom(onnx.numpy_helper.from_array(array * 1.5, tensor.name))
                break
        return original(packed, unpadded, rule, threshold)

    monkeypatch.setattr(qkv_switch, "switch", wrong_unpadded)
    monkeypatch.setattr(qkv_switch, "choose", lambda timings: qkv_switch.NEVER)
    keras.utils.set_random_seed(0)
    encoder = Encoder(50, 16, hidden_dim=16, num_layers=1, num_heads=2, dropout=0.0)
    with pytest.raises(ParityError, match="differs from Keras"):
        export_model(encoder, tmp_path / "enc", formats=["onnx"], optimize=True, verbose=False)


def test_the_unpadded_branch_projects_q_k_v_on_the_real_tokens_alone(fused_encoder, tmp_path):
    import onnxruntime as ort

    _, folder, _ = fused_encoder
    path = tmp_path / "unpadded.onnx"
    onnx.save(qkv_switch.with_threshold(onnx.load(folder / "model.opt.onnx"), qkv_switch.ALWAYS),
              path)  # fmt: skip
    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(tmp_path / "profile")
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    shapes = _profiled_shapes(session, _feeds(IDS))
    kept = int(((IDS != 0) | (np.arange(IDS.shape[1]) == 0)).sum())  # 26 of 42 positions
    matmuls = [s for op in ("MatMul", "FusedMatMul") for s in shapes.get(op, [])]
    # Per block: q, k, v, the attention output and 2 feed-forward projections, on the kept
    # tokens alone (onnxruntime may fuse some); none on the padded (B, T) layout.
    assert sum(s[:2] == [1, kept] for s in matmuls) >= 2 * 6, matmuls
    assert not [s for s in matmuls if len(s) == 3 and s[:2] == list(IDS.shape)], matmuls
    assert shapes["MultiHeadAttention"] == [[*IDS.shape, 16]] * 2  # q scattered back for it


def test_feeds_timed_at_export_are_half_and_three_quarters_padding():
    from tests.models.model_cases import build

    model = build("multiple_choice")[0]  # token ids (B, C, T): choices merged into the batch
    pad = 99_999  # not an id the sampled rows hold: the rule's padding id, whatever it is
    rule = {"input": "token_ids", "pad_token_id": pad, "outputs": []}
    feeds = qkv_switch.switch_feeds(model, rule)
    (light, heavy) = sorted(feeds)
    assert 0.5 <= light < 0.6 and 0.75 <= heavy < 0.85
    for share, batch in feeds.items():
        ids = batch["token_ids"]
        assert ids.ndim == 3 and np.mean(ids == pad) == share
        assert not (ids[0] == pad).any()  # the first row is whole
        # Segment ids are cut where the ids are: padding there is segment 0.
        assert not batch["segment_ids"][ids == pad].any()
    assert qkv_switch.switch_feeds(model, {"input": "no_such_input", "pad_token_id": 0}) == {}


def test_graphs_a_switch_cannot_hold_are_left_alone(fused_encoder):
    from onnx import helper

    _, folder, _ = fused_encoder
    model = onnx.load(folder / "model.onnx")
    packed, unpadded = fuse(model), fuse(model, pack_qkv=False)
    rule = padding_rule(packed)
    # Another padding rule (e.g. the unpad pass refused one fusion), a name the switch adds.
    assert qkv_switch.switch(packed, fuse(model, unpad=False, pack_qkv=False), rule) is None
    for graph in (packed, unpadded):
        graph.graph.output[0].name = "qkv_switch/sequence_output"
        graph.graph.node.append(helper.make_node("Identity", ["sequence_output"],
                                                 ["qkv_switch/sequence_output"]))  # fmt: skip
    assert qkv_switch.switch(packed, unpadded, rule) is None
    # A graph output that is a graph input: an If may not return an outer value.
    packed, unpadded = fuse(model), fuse(model, pack_qkv=False)
    for graph in (packed, unpadded):
        graph.graph.output.append(graph.graph.input[0])
    assert qkv_switch.switch(packed, unpadded, rule) is None


def test_wrong_arguments_name_themselves(fused_encoder):
    from keras_attn_export.optimize import count_ops

    _, folder, _ = fused_encoder
    switched, plain = onnx.load(folder / "model.opt.onnx"), onnx.load(folder / "model.onnx")
    with pytest.raises(ValueError, match="threshold=nan"):
        qkv_switch.with_threshold(switched, float("nan"))
    with pytest.raises(ValueError, match="threshold=2"):
        qkv_switch.with_threshold(switched, 2.0)
    with pytest.raises(ValueError, match="has no q/k/v switch"):
        qkv_switch.with_threshold(plain, 0.5)
    with pytest.raises(ValueError, match="has no q/k/v switch"):
        qkv_switch.branch(plain, "packed")
    with pytest.raises(ValueError, match="kind='both'"):
        qkv_switch.branch(switched, "both")
    with pytest.raises(ValueError, match="qkv='both'"):
        count_ops(plain, qkv="both")
