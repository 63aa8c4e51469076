"""onnxscript pattern rules for the graphs tf2onnx writes of our models: LayerNorm and exact
GELU as fused operators, attention as onnxruntime's `MultiHeadAttention`, `tf.tensordot`'s
reshapes and Keras's negative-id wrap removed (`rules()`, applied by `optimize.fuse`)."""

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import onnx_ir as ir
    from onnxscript.rewriter import pattern


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


def constant_array(value: "ir.Value | None") -> np.ndarray | None:
    """The value of a constant `value` as a NumPy array, or None."""
    const = None if value is None else value.const_value
    return None if const is None else const.numpy()


def _vector(value):
    array = constant_array(value)
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

    def parameter(value: "ir.Value | None", fill: float) -> "ir.Value":
        if value is None:
            name = f"{x.name}_layer_norm_{'scale' if fill else 'bias'}"
            return op.initializer(ir.tensor(np.full(width, fill, np.float32), name=name))
        # A constant: `_layer_norm_check` accepted only constant gamma and beta.
        if len(value.const_value.shape) == 1:  # type: ignore[union-attr]
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
    kernel, reshape = constant_array(kernel), _producer(flat, "Reshape")
    if kernel is None or kernel.ndim != 2 or reshape is None:
        return None
    x, flat_shape = reshape.inputs[0], constant_array(reshape.inputs[1])
    if flat_shape is None or list(flat_shape) != [-1, kernel.shape[0]]:
        return None
    if x.shape is None or len(x.shape) < 3:
        return None
    # out_shape = Concat(Gather(Shape(x), [0 .. rank-2]), [n]), through Casts.
    concat = _producer(out_shape, "Concat")
    if concat is None or len(concat.inputs) != 2 or constant_array(concat.inputs[1]) is None:
        return None
    if list(constant_array(concat.inputs[1]).reshape(-1)) != [kernel.shape[1]]:
        return None
    gather = _producer(concat.inputs[0], "Gather")
    if gather is None or gather.attributes.get_int("axis", 0) != 0:
        return None
    indices = constant_array(gather.inputs[1])
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
    axis = gathered.producer().attributes.get_int("axis", 0)
    return axis == 0 and _scalar(zero) == 0.0 and wrapped_index(table, ids, size)


def _wrapped_gather_replace(op, table, ids, **_):
    return op.Gather(table, ids, axis=0)


def rules() -> "pattern.RewriteRuleSet":
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


def wrapped_index(table: "ir.Value", ids: "ir.Value", size: "ir.Value") -> bool:
    """Whether `size` wraps negative `ids` into `table`'s rows (ONNX `Gather` does that itself)."""
    rows = None if table.shape is None else table.shape[0]
    constant = constant_array(size)
    return (
        isinstance(rows, int)
        and constant is not None
        and constant.size == 1
        and int(np.asarray(constant).reshape(-1)[0]) == rows
    )
