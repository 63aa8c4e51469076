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
import tempfile
from pathlib import Path

import numpy as np

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


def _normalized(op, x, epsilon):
    # tf.nn.moments + batch_normalization, as tf2onnx writes them for a last-axis LayerNorm.
    mean = op.GlobalAveragePool(x)
    centered = op.Sub(x, mean)
    variance = op.GlobalAveragePool(op.Mul(centered, centered))
    return mean, op.Reciprocal(op.Sqrt(op.Add(variance, epsilon)))


# TensorFlow's grappler folds away a gamma of ones or a beta of zeros (an untrained or
# unscaled LayerNorm) before tf2onnx sees the graph, so four variants occur.
def _ln_gamma_beta(op, x, epsilon, gamma, beta):
    mean, inv = _normalized(op, x, epsilon)
    scale = op.Mul(inv, gamma)
    return op.Add(op.Mul(x, scale), op.Add(op.Mul(op.Neg(mean), scale), beta))


def _ln_gamma(op, x, epsilon, gamma):
    mean, inv = _normalized(op, x, epsilon)
    scale = op.Mul(inv, gamma)
    return op.Add(op.Mul(x, scale), op.Mul(op.Neg(mean), scale))


def _ln_beta(op, x, epsilon, beta):
    mean, inv = _normalized(op, x, epsilon)
    return op.Add(op.Mul(x, inv), op.Add(op.Mul(op.Neg(mean), inv), beta))


def _ln_plain(op, x, epsilon):
    mean, inv = _normalized(op, x, epsilon)
    return op.Add(op.Mul(x, inv), op.Mul(op.Neg(mean), inv))


def _scalar(value):
    const = value.const_value
    if const is None:
        return None
    array = const.numpy()
    return float(array.reshape(-1)[0]) if array.size == 1 else None


def _array(value):
    const = None if value is None else value.const_value
    return None if const is None else const.numpy()


def _vector(value):
    array = _array(value)
    return None if array is None else array.reshape(-1)


def _layer_norm_check(context, x, epsilon, gamma=None, beta=None, **_):
    if _scalar(epsilon) is None:
        return False
    widths = {v.size for v in (_vector(gamma), _vector(beta)) if v is not None}
    if any(v is not None and _vector(v) is None for v in (gamma, beta)) or len(widths) > 1:
        return False
    # GlobalAveragePool averages every axis after the second: the last one only at rank 3.
    # Where inference lost the rank (dynamic reshapes), tf2onnx chose the operator knowing
    # it; the export's parity check would catch a wrong rewrite.
    shape = x.shape
    if shape is None:
        return bool(widths)
    width = widths.pop() if widths else shape[-1]
    return len(shape) == 3 and isinstance(width, int) and shape[-1] in (width, None)


def _layer_norm_replace(op, x, epsilon, gamma=None, beta=None, **_):
    import onnx_ir as ir

    width = (
        _vector(gamma).size
        if gamma is not None
        else _vector(beta).size
        if beta is not None
        else x.shape[-1]
    )

    def parameter(value, fill):
        if value is None:
            name = f"{x.name}_layer_norm_{'scale' if fill else 'bias'}"
            return op.initializer(ir.tensor(np.full(width, fill, np.float32), name=name))
        if len(value.const_value.shape) == 1:
            return value
        return op.Reshape(value, op.Constant(value_ints=[-1]))  # folded by onnxruntime

    return op.LayerNormalization(
        x, parameter(gamma, 1.0), parameter(beta, 0.0), axis=-1, epsilon=_scalar(epsilon)
    )


def _gelu_pattern(op, x, half, one, inv_sqrt2):
    return op.Mul(op.Mul(half, x), op.Add(one, op.Erf(op.Mul(x, inv_sqrt2))))


def _gelu_check(context, x, half, one, inv_sqrt2, **_):
    values = (_scalar(half), _scalar(one), _scalar(inv_sqrt2))
    return None not in values and np.allclose(values, (0.5, 1.0, 2**-0.5), rtol=1e-6)


def _gelu_replace(op, x, **_):
    return op.Gelu(x, _domain="com.microsoft")


def _heads(op, x, shape, perm):
    return op.Transpose(op.Reshape(x, shape), perm=perm)


# Attention as `onnx_tracing` writes it: (B, T, H·d) projections split into heads,
# softmax(q kᵀ [+ bias]) v, heads merged back. Queries arrive already scaled.
def _attention_core(op, scores, v, v_shape, out_shape):
    weights = op.Softmax(scores, _outputs=["weights"])
    out = op.Transpose(op.MatMul(weights, _heads(op, v, v_shape, [0, 2, 1, 3])), perm=[0, 2, 1, 3])
    return op.Reshape(out, out_shape)


def _scores(op, q, k, q_shape, k_shape):
    q_heads = op.Transpose(op.Reshape(q, q_shape), perm=[0, 2, 1, 3], _outputs=["q_heads"])
    return op.MatMul(q_heads, _heads(op, k, k_shape, [0, 2, 3, 1]))


def _attention_bias(op, q, k, v, q_shape, k_shape, v_shape, out_shape, bias):
    scores = op.Add(_scores(op, q, k, q_shape, k_shape), bias)
    return _attention_core(op, scores, v, v_shape, out_shape)


def _attention_plain(op, q, k, v, q_shape, k_shape, v_shape, out_shape):
    scores = _scores(op, q, k, q_shape, k_shape)
    return _attention_core(op, scores, v, v_shape, out_shape)


def _attention_check(context, q, k, v, q_heads, weights, bias=None, **_):
    axis = weights.producer().attributes.get_int("axis", -1)
    shapes = [t.shape for t in (q, k, v, q_heads)]
    if axis not in (-1, 3) or any(s is None for s in shapes):
        return False
    (q, k, v, q_heads), heads = shapes, shapes[3][1]
    if not isinstance(heads, int) or [len(s) for s in shapes] != [3, 3, 3, 4]:
        return False
    widths = [s[-1] for s in (q, k, v)]
    if not all(isinstance(w, int) and w % heads == 0 for w in widths) or widths[0] != widths[1]:
        return False
    # onnxruntime takes the bias as (B|1, H|1, T, S).
    return bias is None or (bias.shape is not None and len(bias.shape) == 4)


def _attention_replace(op, q, k, v, q_heads, bias=None, **_):
    return op.MultiHeadAttention(
        q, k, v, None, None, bias,
        num_heads=q_heads.shape[1], scale=1.0, _domain="com.microsoft",
    )  # fmt: skip


# Keras's matmul of a (B, T, d) tensor by a (d, n) kernel is `tf.tensordot`, which tf2onnx
# writes as Reshape to (B·T, d), MatMul, and Reshape back to Shape(x)[:-1] + [n] (seven
# shape nodes); onnxruntime's MatMul takes (B, T, d) as it is. The flattening Reshape may be
# shared by several projections of one input, so it is checked, not matched.
def _tensordot(op, flat, kernel, out_shape):
    return op.Reshape(op.MatMul(flat, kernel), out_shape)


def _producer(value, op_type):
    node = None if value is None else value.producer()
    while node is not None and node.op_type == "Cast" and op_type != "Cast":
        node = node.inputs[0].producer()
    return node if node is not None and node.op_type == op_type else None


def _tensordot_input(flat, kernel, out_shape):
    """The (B, T, d) tensor `flat` was flattened from, when `_tensordot` matches one."""
    kernel, reshape = _array(kernel), _producer(flat, "Reshape")
    if kernel is None or kernel.ndim != 2 or reshape is None:
        return None
    x, flat_shape = reshape.inputs[0], _array(reshape.inputs[1])
    if flat_shape is None or list(flat_shape) != [-1, kernel.shape[0]]:
        return None
    if x.shape is None or len(x.shape) < 3:
        return None
    # out_shape = Concat(Gather(Shape(x), [0 .. rank-2]), [n]), through Casts.
    concat = _producer(out_shape, "Concat")
    if concat is None or len(concat.inputs) != 2 or _array(concat.inputs[1]) is None:
        return None
    if list(_array(concat.inputs[1]).reshape(-1)) != [kernel.shape[1]]:
        return None
    gather = _producer(concat.inputs[0], "Gather")
    if gather is None or gather.attributes.get_int("axis", 0) != 0:
        return None
    indices = _array(gather.inputs[1])
    if indices is None or list(indices.reshape(-1)) != list(range(len(x.shape) - 1)):
        return None
    shape = _producer(gather.inputs[0], "Shape")
    return x if shape is not None and shape.inputs[0] is x and not shape.attributes else None


def _tensordot_check(context, flat, kernel, out_shape, **_):
    return _tensordot_input(flat, kernel, out_shape) is not None


def _tensordot_replace(op, flat, kernel, out_shape, **_):
    return op.MatMul(_tensordot_input(flat, kernel, out_shape), kernel)


# Keras's `take` wraps negative ids (`where(ids < 0, ids + rows, ids)`, which tf2onnx writes
# as nine arithmetic nodes); ONNX's `Gather` wraps them itself.
def _wrapped_gather(op, table, ids, zero, size):
    negative = op.Less(op.Cast(ids), zero)
    wrapped = op.Add(
        op.Mul(op.Cast(negative), op.Add(ids, size)), op.Mul(ids, op.Cast(op.Not(negative)))
    )
    return op.Gather(table, wrapped, _outputs=["gathered"])


def _wrapped_gather_check(context, table, ids, zero, size, gathered, **_):
    from keras_attn_export.passes import wrapped_index

    axis = gathered.producer().attributes.get_int("axis", 0)
    return axis == 0 and _scalar(zero) == 0.0 and wrapped_index(table, ids, size)


def _wrapped_gather_replace(op, table, ids, **_):
    return op.Gather(table, ids, axis=0)


def _rules():
    from onnxscript.rewriter import pattern

    return pattern.RewriteRuleSet(
        [
            *(
                pattern.RewriteRule(target, _layer_norm_replace, _layer_norm_check)
                for target in (_ln_gamma_beta, _ln_gamma, _ln_beta, _ln_plain)
            ),
            pattern.RewriteRule(_gelu_pattern, _gelu_replace, _gelu_check, name="Gelu"),
            pattern.RewriteRule(_tensordot, _tensordot_replace, _tensordot_check),
            pattern.RewriteRule(_wrapped_gather, _wrapped_gather_replace, _wrapped_gather_check),
            *(
                pattern.RewriteRule(target, _attention_replace, _attention_check)
                for target in (_attention_bias, _attention_plain)
            ),
        ],
        commute=True,
    )


def count_ops(model) -> dict[str, int]:
    """`{op_type: count}` of the fused operators (`FUSED_OPS`) in an ONNX model (proto)."""
    counts = collections.Counter(node.op_type for node in model.graph.node)
    return {op: counts[op] for op in FUSED_OPS if counts[op]}


def fuse(model, pack_qkv=True):
    """`model` (ONNX proto) with LayerNorm, GELU and attention patterns replaced by fused
    operators, and its shapes annotated so onnxruntime's own fusions apply.

    `pack_qkv=False` keeps the q, k and v projections as three MatMuls before
    `MultiHeadAttention`: the graph to quantize, since onnxruntime's quantizer would leave a
    packed `Attention` in float32 (its `QAttention` takes a mask index, not our additive
    mask bias)."""
    import onnx
    import onnx_ir as ir
    from keras_attn_export import passes
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
    _rules().apply_to_model(ir_model)
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
    fused = ir.to_proto(ir_model)
    # Symbolic inference can get a rank wrong (a batched Gather); onnxruntime infers again.
    del fused.graph.value_info[:]
    onnx.checker.check_model(fused)
    return fused


def runtime_fused_counts(path: Path) -> dict[str, int]:
    """Fused operators after onnxruntime's own load-time optimizations of the file at `path`
    (what a session actually runs), from its offline-optimized copy."""
    import onnx
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        options.optimized_model_filepath = str(Path(tmp) / "optimized.onnx")
        ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        return count_ops(onnx.load(options.optimized_model_filepath))


def gelu_fed_matmuls(model) -> list[str]:
    """Names of the MatMuls that read a GELU's output (each block's feed-forward output
    projection), in graph order."""
    gelus = {"Gelu", "BiasGelu", "FastGelu"}
    produced = {out: node.op_type for node in model.graph.node for out in node.output}
    return [
        node.name
        for node in model.graph.node
        if node.op_type == "MatMul" and produced.get(node.input[0]) in gelus
    ]


def quantize_int8(source: Path, target: Path, weights="u8", float_ffn_outputs=2) -> list[str]:
    """Dynamic int8 quantization of the MatMul and Gemm projections, with signed (`"s8"`) or
    unsigned (`"u8"`) weights (`keras_attn_export.hardware.int8_weight_type` picks by CPU);
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
