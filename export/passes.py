"""Graph passes over onnx_ir models that `optimize.fuse` runs after onnxruntime's fusions:
work the PyTorch path's graph never had, removed without changing a value.

- `mask_index`: attention whose bias is a padding row `(mask - 1) · c` (`c` huge), as our
  `attend_for_onnx` writes it, takes the mask as onnxruntime's 2-D mask index instead (no
  `(B, 1, T, S)` bias; onnxruntime masks with its own filter value, -10000 by default, which
  gives the same weights, exp(-10000) = 0 in float32);
- `drop_redundant_expands`: `Add(x, Expand(y, shape))` where the expansion only reaches
  `x`'s own shape (tf2onnx's `BroadcastTo` of position embeddings) adds `y` as it is;
- `trim_outputs`: optional outputs nobody reads (`SkipLayerNormalization`'s mean, inverse
  standard deviation and sum) are not computed.
"""

import numpy as np

# Attention's inputs: input, weights, bias, mask_index, past, attention_bias.
# MultiHeadAttention's: query, key, value, bias, key_padding_mask, attention_bias, ...
_MASK_SLOT = {"Attention": 3, "MultiHeadAttention": 4}
_BIAS_SLOT = 5
_HUGE = 1e4  # a bias this negative is a mask, not a learned score bias


def _producer(value, op_type):
    node = None if value is None else value.producer()
    return node if node is not None and node.op_type == op_type and node.domain == "" else None


def _constant(value):
    const = None if value is None else value.const_value
    return None if const is None else const.numpy()


def _unsqueezed_axes(value):
    """`(source, axes)` for a chain of Unsqueezes ending in `value` (axes of the result)."""
    axes = []
    while (node := _producer(value, "Unsqueeze")) is not None:
        step = _constant(node.inputs[1]) if len(node.inputs) > 1 else None
        if step is None:
            return value, None
        rank = len(node.outputs[0].shape) if node.outputs[0].shape is not None else None
        if rank is None:
            return value, None
        step = sorted(int(a) % rank for a in step.reshape(-1))
        # Axes inserted earlier shift right past the ones inserted now.
        for a in step:
            axes = [x + 1 if x >= a else x for x in axes]
        axes = sorted(axes + step)
        value = node.inputs[0]
    return value, axes


def _padding_mask(bias):
    """The bool `(B, S)` mask behind a `(B, 1, 1, S)` bias `(Cast(mask) - 1) · c`, or None."""
    import onnx_ir as ir

    row, axes = _unsqueezed_axes(bias)
    if axes != [1, 2] or row.shape is None or len(row.shape) != 2:
        return None
    mul = _producer(row, "Mul")
    if mul is None:
        return None
    for sub_value, scale_value in (mul.inputs, mul.inputs[::-1]):
        sub, scale = _producer(sub_value, "Sub"), _constant(scale_value)
        if sub is None or scale is None or scale.size != 1 or float(scale.reshape(-1)[0]) < _HUGE:
            continue
        one, cast = _constant(sub.inputs[1]), _producer(sub.inputs[0], "Cast")
        if one is None or one.size != 1 or float(one.reshape(-1)[0]) != 1.0 or cast is None:
            continue
        mask = cast.inputs[0]
        if mask.dtype == ir.DataType.BOOL:
            return mask
    return None


def mask_index(model) -> int:
    """Rewrites attention padding biases into 2-D mask indices; returns how many."""
    import onnx_ir as ir

    as_int32 = {}
    changed = 0
    for node in list(model.graph):
        slot = _MASK_SLOT.get(node.op_type)
        if slot is None or node.domain != "com.microsoft" or len(node.inputs) <= _BIAS_SLOT:
            continue
        if node.inputs[slot] is not None or node.inputs[_BIAS_SLOT] is None:
            continue
        if any(v is not None for v in node.inputs[_BIAS_SLOT + 1 :]):
            continue  # a cache (past key/value) is in play: leave the bias as it is
        mask = _padding_mask(node.inputs[_BIAS_SLOT])
        if mask is None:
            continue
        if mask not in as_int32:
            cast = ir.node("Cast", [mask], attributes={"to": ir.DataType.INT32})
            cast.outputs[0].name = f"{mask.name}_mask_index"
            model.graph.insert_before(node, cast)
            as_int32[mask] = cast.outputs[0]
        node.replace_input_with(slot, as_int32[mask])
        node.resize_inputs(_BIAS_SLOT)
        while node.inputs and node.inputs[-1] is None:
            node.resize_inputs(len(node.inputs) - 1)
        changed += 1
    return changed


def _same_dims(a, b):
    """Both shapes known to be equal: each axis the same int or the same named symbol."""
    if a is None or b is None or len(a) != len(b):
        return False

    def equal(x, y):
        if isinstance(x, int) or isinstance(y, int):
            return x == y
        return getattr(x, "value", None) is not None and x == y

    return all(equal(x, y) for x, y in zip(a, b, strict=True))


def drop_redundant_expands(model) -> int:
    """`Add(x, Expand(y, s)) -> Add(x, y)` where the expansion has `x`'s shape; returns how
    many. Shapes come from onnxruntime's symbolic inference (equal axes share a name)."""
    changed = 0
    for node in list(model.graph):
        if node.op_type != "Add" or node.domain != "" or len(node.inputs) != 2:
            continue
        for slot in (0, 1):
            expand, other = _producer(node.inputs[slot], "Expand"), node.inputs[1 - slot]
            if expand is None or other is None:
                continue
            source, result = expand.inputs[0], expand.outputs[0]
            if source.shape is None or other.shape is None:
                continue
            if len(source.shape) > len(other.shape):
                continue
            same = _same_dims(result.shape, other.shape)
            if same and _same_dims(node.outputs[0].shape, other.shape):
                node.replace_input_with(slot, source)
                changed += 1
                break
    return changed


def trim_outputs(model, op_types=("SkipLayerNormalization",)) -> int:
    """Drops the trailing optional outputs of `op_types` nodes that nothing reads."""
    graph_outputs = set(model.graph.outputs)
    changed = 0
    for node in model.graph:
        if node.op_type not in op_types:
            continue
        keep = len(node.outputs)
        while keep > 1:
            value = node.outputs[keep - 1]
            if value in graph_outputs or value.uses():
                break
            keep -= 1
        if keep < len(node.outputs):
            node.resize_outputs(keep)
            changed += 1
    return changed


def wrapped_index(table, ids, size) -> bool:
    """Whether `size` wraps negative `ids` into `table`'s rows (ONNX `Gather` does that itself)."""
    rows = None if table.shape is None else table.shape[0]
    size = _constant(size)
    return (
        isinstance(rows, int)
        and size is not None
        and size.size == 1
        and int(np.asarray(size).reshape(-1)[0]) == rows
    )
