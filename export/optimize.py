"""Faster ONNX: fused operators in tf2onnx graphs of our models, and int8 quantization.

tf2onnx writes Keras's LayerNormalization as eleven elementwise nodes (GlobalAveragePool, Neg,
Sub, Mul, Sqrt, Reciprocal, ...) and exact GELU as five, patterns onnxruntime's own fusions
do not recognize (its transformer optimizer fuses zero nodes on these graphs). `fuse`
constant-folds the graph with onnxscript's optimizer and rewrites those patterns with
onnxscript's pattern rewriter into the standard `LayerNormalization` (opset >= 17) and
onnxruntime's `Gelu` (com.microsoft); onnxruntime then fuses further at load time (e.g.
`SkipLayerNormalization`, `FusedMatMul`). `quantize_int8` is onnxruntime's dynamic
quantization with unsigned weights.
"""

import collections
import tempfile
from pathlib import Path

import numpy as np

FUSED_OPS = (
    "LayerNormalization",
    "SkipLayerNormalization",
    "Gelu",
    "FastGelu",
    "BiasGelu",
    "Attention",
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


def _vector(value):
    const = None if value is None else value.const_value
    return None if const is None else const.numpy().reshape(-1)


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


def _rules():
    from onnxscript.rewriter import pattern

    return pattern.RewriteRuleSet(
        [
            *(
                pattern.RewriteRule(target, _layer_norm_replace, _layer_norm_check)
                for target in (_ln_gamma_beta, _ln_gamma, _ln_beta, _ln_plain)
            ),
            pattern.RewriteRule(_gelu_pattern, _gelu_replace, _gelu_check, name="Gelu"),
        ],
        commute=True,
    )


def count_ops(model) -> dict[str, int]:
    """`{op_type: count}` of the fused operators (`FUSED_OPS`) in an ONNX model (proto)."""
    counts = collections.Counter(node.op_type for node in model.graph.node)
    return {op: counts[op] for op in FUSED_OPS if counts[op]}


def fuse(model):
    """`model` (ONNX proto) with LayerNorm and GELU patterns replaced by fused operators."""
    import onnx
    import onnx_ir as ir
    from onnxscript import optimizer

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
    ir_model.opset_imports.setdefault("com.microsoft", 1)
    optimizer.remove_unused_nodes(ir_model)
    fused = ir.to_proto(ir_model)
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


def quantize_int8(source: Path, target: Path) -> None:
    """Dynamic int8 quantization with unsigned (uint8) weights; MatMul and Gemm projections.

    Signed weights drifted 31% (72% argmax agreement) on a CPU without VNNI, unsigned 2%.
    `DefaultTensorType` lets the quantizer handle tensors whose type shape inference lost.
    """
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(
        str(source),
        str(target),
        weight_type=QuantType.QUInt8,
        op_types_to_quantize=["MatMul", "Gemm"],
        extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
    )
