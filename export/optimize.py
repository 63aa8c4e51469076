"""Faster ONNX: fused operators in tf2onnx graphs of our models, and int8 quantization.

tf2onnx writes Keras's LayerNormalization as eleven elementwise nodes (GlobalAveragePool, Neg,
Sub, Mul, Sqrt, Reciprocal, ...) and exact GELU as five, patterns onnxruntime's own fusions
do not recognize (its transformer optimizer fuses zero nodes on these graphs). `fuse`
constant-folds the graph with onnxscript's optimizer and rewrites those patterns with
onnxscript's pattern rewriter into the standard `LayerNormalization` (opset >= 17) and
onnxruntime's `Gelu` (com.microsoft); onnxruntime then fuses further at load time (e.g.
`SkipLayerNormalization`, `FusedMatMul`), and onnxscript's onnxruntime fusions pack each
self-attention's q, k, v into `Attention`. `quantize_int8` is onnxruntime's dynamic
quantization, with signed or unsigned weights as the CPU suits.
"""

import collections
import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from keras_attn_export.graph_meta import PADDING_KEY, padding_rule  # noqa: F401  (its home)

if TYPE_CHECKING:
    import onnx

FUSED_OPS = (
    "LayerNormalization",
    "EmbedLayerNormalization",
    "SkipLayerNormalization",
    "Gelu",
    "FastGelu",
    "BiasGelu",
    "Attention",
    "QAttention",
    "MultiHeadAttention",
    "FusedMatMul",
    "MatMulIntegerToFloat",
    "DynamicQuantizeMatMul",
)


def count_ops(model: "onnx.ModelProto", qkv: str = "packed") -> dict[str, int]:
    """`{op_type: count}` of the fused operators (`FUSED_OPS`) in an ONNX model (proto); in a
    graph with q/k/v switched by padding (`keras_attn_export.qkv_switch`), those of its
    `qkv` branch (`"packed"` or `"unpadded"`) with the graph's own."""
    from keras_attn_export import qkv_switch

    if qkv not in qkv_switch.BRANCHES:
        raise ValueError(f"`qkv` is 'packed' or 'unpadded'. Received: qkv={qkv!r}")
    nodes = list(model.graph.node)
    if qkv_switch.find(model) is not None:
        nodes += list(qkv_switch.branch(model, qkv).node)
    counts = collections.Counter(node.op_type for node in nodes)
    return {op: counts[op] for op in FUSED_OPS if counts[op]}


def fuse(model: "onnx.ModelProto", pack_qkv: bool = True, unpad: bool = True) -> "onnx.ModelProto":
    """`model` (ONNX proto) with LayerNorm, GELU and attention patterns replaced by fused
    operators, and its shapes annotated so onnxruntime's own fusions apply.

    `pack_qkv=False` keeps the q, k and v projections as three MatMuls before
    `MultiHeadAttention`: the graph to quantize, since onnxruntime's quantizer would leave a
    packed `Attention` in float32 (its `QAttention` takes a mask index, not our additive
    mask bias)."""
    import onnx
    import onnx_ir as ir
    from keras_attn_export import passes
    from keras_attn_export.patterns import rules
    from onnx_ir.passes.common import TopologicalSortPass
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference
    from onnxscript import optimizer
    from onnxscript.rewriter.ort_fusions.attention import fuse_attention
    from onnxscript.rewriter.ort_fusions.bias_gelu import fuse_bias_gelu
    from onnxscript.rewriter.ort_fusions.mha_bias import fuse_mha_bias
    from onnxscript.rewriter.ort_fusions.mha_scale import fuse_mha_scale
    from onnxscript.rewriter.ort_fusions.skip_normalization import fuse_skip_layer_normalization

    if not any(o.domain in ("", "ai.onnx") and o.version >= 17 for o in model.opset_import):
        raise ValueError("Fusing LayerNormalization needs opset >= 17.")
    # Shapes tell the rewrite that GlobalAveragePool's input has rank 3 (then it averages
    # the last axis only, as LayerNorm does).
    ir_model = ir.from_proto(onnx.shape_inference.infer_shapes(model))
    # Constant folding only (gamma, beta and epsilon become constants). Not the full
    # `optimizer.optimize`: it drops `variance + 1e-12` as adding zero, which turns a
    # constant row's LayerNorm into 0/0 = NaN and loses the epsilon the fused node needs.
    optimizer.fold_constants(ir_model)
    rules().apply_to_model(ir_model)
    optimizer.fold_constants(ir_model)  # e.g. the reshaped LayerNorm gammas and betas
    ir_model.opset_imports.setdefault("com.microsoft", 1)
    optimizer.remove_unused_nodes(ir_model)
    # tf2onnx gives every dynamic axis its own name, so no fusion can tell that a residual
    # and a projection have the same shape. onnxruntime's symbolic shape inference merges
    # equal axes; then onnxscript's onnxruntime fusions add SkipLayerNormalization (residual
    # + LayerNorm), BiasGelu and the attention scale. (Not its whole `optimize_for_ort`: its
    # optimizer writes opset-18 Split attributes into opset-17 graphs.)
    annotated = SymbolicShapeInference.infer_shapes(ir.to_proto(ir_model), auto_merge=True)
    ir_model = ir.from_proto(annotated)
    # With `pack_qkv`, the q, k and v projections of one input are then packed into
    # onnxruntime's `Attention` (one (d, 3d) matmul, as in the PyTorch path's graph): their
    # biases move into `MultiHeadAttention`, then the three matmuls and it become one node.
    fusions = [fuse_skip_layer_normalization, fuse_bias_gelu, fuse_mha_scale]
    if pack_qkv:
        fusions += [fuse_mha_bias, fuse_attention]
    for fusion in fusions:
        fusion(ir_model)
    passes.mask_index(ir_model)
    passes.drop_redundant_expands(ir_model)
    passes.trim_outputs(ir_model)
    passes.embed_layer_norm(ir_model)
    optimizer.fold_constants(ir_model)  # the packed weights and biases: one constant each
    optimizer.remove_unused_nodes(ir_model)
    TopologicalSortPass()(ir_model)  # rewrites may leave new nodes after their users
    if unpad:  # it needs ranks: shapes again, of the fused operators' values too
        from keras_attn_export.unpad import unpad as unpad_pass

        annotated = SymbolicShapeInference.infer_shapes(ir.to_proto(ir_model), auto_merge=True)
        ir_model = ir.from_proto(annotated)
        rule = unpad_pass(ir_model)
        optimizer.remove_unused_nodes(ir_model)
        if rule is not None:  # which positions are padding, read back by `padding_rule`
            ir_model.metadata_props[PADDING_KEY] = json.dumps(rule)
    fused = ir.to_proto(ir_model)
    # Symbolic inference can get a rank wrong (a batched Gather); onnxruntime infers again.
    del fused.graph.value_info[:]
    onnx.checker.check_model(fused)
    return fused


def runtime_optimized(path: Path) -> "onnx.ModelProto":
    """The file at `path` after onnxruntime's own load-time optimizations (what a session
    actually runs), from its offline-optimized copy."""
    import onnx
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        options.optimized_model_filepath = str(Path(tmp) / "optimized.onnx")
        ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        return onnx.load(options.optimized_model_filepath)


def runtime_fused_counts(path: Path) -> dict[str, int]:
    """Fused operators onnxruntime runs in the file at `path` (`runtime_optimized`); of the
    packed branch where q/k/v are switched by padding (`count_ops`)."""
    return count_ops(runtime_optimized(path))


def gelu_fed_matmuls(model: "onnx.ModelProto") -> list[str]:
    """Names of the MatMuls that read a GELU's output (each block's feed-forward output
    projection), in graph order."""
    gelus = {"Gelu", "BiasGelu", "FastGelu"}
    produced = {out: node.op_type for node in model.graph.node for out in node.output}
    return [
        node.name
        for node in model.graph.node
        if node.op_type == "MatMul" and produced.get(node.input[0]) in gelus
    ]


def quantize_int8(
    source: Path, target: Path, weights: str = "u8", float_ffn_outputs: int = 2
) -> list[str]:
    """Dynamic int8 quantization of the MatMul and Gemm projections, with signed (`"s8"`) or
    unsigned (`"u8"`) weights (`keras_attn_export.graphs.write_int8` measures both);
    returns the names of the MatMuls left in float32.

    Signed weights drifted 31% (72% argmax agreement) on a CPU without VNNI, unsigned 2%; with
    VNNI signed weights are accurate and run onnxruntime's fast int8 kernels. Scales are per
    output channel: on MiniLM (32 real lines, batch 32) the worst sentence embedding's cosine
    to float32 rose from 0.929 to 0.988 (s8) and 0.969 to 0.988 (u8) at the same speed.
    The first `float_ffn_outputs` feed-forward output projections stay float32: their inputs,
    GELU outputs of the first blocks, have the widest range in BERT-style encoders, and one
    activation scale per tensor loses most there. On MiniLM (s8, batch 32) leaving out any
    one other projection kept the worst cosine at 0.977-0.989; leaving out these two raised it
    from 0.988 to 0.991 (mean 0.992 to 0.994), all six to 0.993 at a third of the FLOPs.
    `DefaultTensorType` lets the quantizer handle tensors whose type shape inference lost.
    """
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    keep = gelu_fed_matmuls(onnx.load(str(source), load_external_data=False))
    keep = keep[: max(0, int(float_ffn_outputs))]
    quantize_dynamic(
        str(source),
        str(target),
        weight_type={"u8": QuantType.QUInt8, "s8": QuantType.QInt8}[weights],
        op_types_to_quantize=["MatMul", "Gemm"],
        per_channel=True,
        nodes_to_exclude=keep,
        extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
    )
    return keep
