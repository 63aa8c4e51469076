"""The graph passes after onnxruntime's fusions: padding biases become mask indices, redundant
expands, wrapped gathers and unread outputs go, lookups + LayerNorm become one node, and every
value stays the same."""

import numpy as np
import onnx
import pytest
from keras_attn_export.onnx import run_onnx
from keras_attn_export.optimize import fuse

pytestmark = pytest.mark.tf_only

# Right padding, left padding, a row of padding alone (no visible key: zeros from attention).
IDS = np.array([[2, 9, 12, 7, 5, 0, 0], [0, 0, 8, 8, 3, 4, 6], [0, 0, 0, 0, 0, 0, 0]], "int32")


@pytest.fixture(scope="module")
def encoder_files(fused_encoder):
    encoder, folder, _ = fused_encoder  # tests/export/conftest.py
    return encoder, folder


def _nodes(model, op_type):
    return [n for n in model.graph.node if n.op_type == op_type]


def _run(path, ids):
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return run_onnx(session, {"token_ids": ids, "segment_ids": np.zeros_like(ids)})


def test_padding_masks_reach_attention_as_a_mask_index(encoder_files):
    _, folder = encoder_files
    # The passes before `unpad` (tests/export/test_unpad.py), which adds Gathers and a Where.
    graph = fuse(onnx.load(folder / "model.onnx"), unpad=False)
    attention = _nodes(graph, "Attention")
    assert len(attention) == 2
    for node in attention:
        # input, weights, bias, mask_index: no (B, 1, T, S) attention bias.
        assert len(node.input) == 4 and node.input[3]
    mask = {n.input[3] for n in attention}
    assert len(mask) == 1  # one int32 cast of the mask, shared by both layers
    (cast,) = [n for n in graph.graph.node if n.output[0] in mask]
    assert cast.op_type == "Cast" and cast.attribute[0].i == onnx.TensorProto.INT32
    # Neither the (B, T, S) mask nor the position embeddings' BroadcastTo is built, ids are
    # not wrapped (Gather wraps negative ids itself), LayerNorm statistics are not written.
    # Self-attention's one padding mask: a visible query sees itself, so the zeroed rows
    # are the padded queries, with no reduction over keys.
    for op_type in ("Expand", "Less", "Where", "Gather", "ReduceSum", "ReduceMax"):
        assert not _nodes(graph, op_type), op_type
    # The lookups and the embeddings' LayerNorm: one node, as in the PyTorch path's graph.
    (embed,) = _nodes(graph, "EmbedLayerNormalization")
    assert embed.input[:2] == ["token_ids", "segment_ids"]
    assert all(len(n.output) == 1 for n in _nodes(graph, "SkipLayerNormalization"))
    raw = onnx.load(folder / "model.onnx")
    assert _nodes(raw, "Expand") and _nodes(raw, "Less")  # what the passes removed


def test_optimized_graph_matches_keras_at_every_position_with_padding(encoder_files, tmp_path):
    encoder, folder = encoder_files
    expected = encoder({"token_ids": IDS, "segment_ids": np.zeros_like(IDS)})
    padded = tmp_path / "padded.onnx"  # fused, still computing padding
    onnx.save(fuse(onnx.load(folder / "model.onnx"), unpad=False), padded)
    for path in (folder / "model.onnx", padded):
        out = _run(path, IDS)
        for key in ("sequence_output", "pooled_output"):
            np.testing.assert_allclose(out[key], expected[key], atol=1e-4, err_msg=path.name)


def test_unpacked_attention_takes_the_key_padding_mask_too(encoder_files, tmp_path):
    # The graph int8 quantizes: q, k, v stay three MatMuls before `MultiHeadAttention`.
    encoder, folder = encoder_files
    unpacked = fuse(onnx.load(folder / "model.onnx"), pack_qkv=False, unpad=False)
    heads = _nodes(unpacked, "MultiHeadAttention")
    assert len(heads) == 2 and not _nodes(unpacked, "Attention")
    for node in heads:
        # query, key, value, bias, key_padding_mask: no attention bias.
        assert len(node.input) == 5 and node.input[4]
    onnx.save(unpacked, tmp_path / "unpacked.onnx")
    out = _run(tmp_path / "unpacked.onnx", IDS)
    expected = encoder({"token_ids": IDS, "segment_ids": np.zeros_like(IDS)})
    np.testing.assert_allclose(out["sequence_output"], expected["sequence_output"], atol=1e-4)


def _attention_graph(scale):
    """x (1, 3, 4) attending with bias `(Cast(mask) - 1) * scale` as a (1, 1, 1, 3) row."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.normal(size=(4, 12)).astype("float32"), "w"),
        numpy_helper.from_array(np.zeros(12, "float32"), "b"),
        numpy_helper.from_array(np.array(1.0, "float32"), "one"),
        numpy_helper.from_array(np.array(scale, "float32"), "scale"),
        numpy_helper.from_array(np.array([1, 2], "int64"), "axes"),
    ]
    nodes = [
        helper.make_node("Cast", ["mask"], ["keep"], to=TensorProto.FLOAT),
        helper.make_node("Sub", ["keep", "one"], ["off"]),
        helper.make_node("Mul", ["off", "scale"], ["row"]),
        helper.make_node("Unsqueeze", ["row", "axes"], ["bias"]),
        helper.make_node(
            "Attention", ["x", "w", "b", "", "", "bias"], ["y"], num_heads=2, domain="com.microsoft"
        ),
    ]
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4]),
         helper.make_tensor_value_info("mask", TensorProto.BOOL, [1, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 4])], inits,
    )  # fmt: skip
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=10)
    return onnx.shape_inference.infer_shapes(model)


@pytest.mark.parametrize("scale, rewritten", [(1e30, True), (5.0, False)])
def test_only_a_mask_sized_bias_becomes_a_mask_index(scale, rewritten):
    # A bias of -5 is a score bias the softmax must see; -1e30 masks, as the index does.
    import onnx_ir as ir
    import onnxruntime as ort
    from keras_attn_export import passes

    proto = _attention_graph(scale)
    model = ir.from_proto(proto)
    assert passes.mask_index(model) == int(rewritten)
    after = ir.to_proto(model)
    (node,) = _nodes(after, "Attention")
    assert len(node.input) == (4 if rewritten else 6)
    if not rewritten:
        return
    x = np.random.default_rng(1).normal(size=(1, 3, 4)).astype("float32")
    mask = np.array([[True, True, False]])
    session = ort.InferenceSession(after.SerializeToString(), providers=["CPUExecutionProvider"])
    got = session.run(None, {"x": x, "mask": mask})[0]
    # softmax(q kᵀ / √2 + bias) v per head, with the bias row of the original graph.
    w = onnx.numpy_helper.to_array(proto.graph.initializer[0])
    q, k, v = np.split(x[0] @ w, 3, axis=-1)
    heads = []
    for h in range(2):
        part = slice(2 * h, 2 * h + 2)
        scores = q[:, part] @ k[:, part].T / np.sqrt(2.0) + (mask[0] - 1.0) * scale
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        heads.append(weights / weights.sum(-1, keepdims=True) @ v[:, part])
    np.testing.assert_allclose(got[0], np.concatenate(heads, -1), atol=1e-5)
