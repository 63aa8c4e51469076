"""Graph passes over onnx_ir models that `optimize.fuse` runs after onnxruntime's fusions:
work the PyTorch path's graph never had, removed without changing a value.

- `mask_index`: attention whose bias is a padding row `(mask - 1) · c` (`c` huge), as our
  `attend_for_onnx` writes it, takes the mask as onnxruntime's 2-D mask index instead, with
  `mask_filter_value = -c` (the same scores; no `(B, 1, T, S)` bias);
- `drop_redundant_expands`: `Add(x, Expand(y, shape))` where the expansion only reaches
  `x`'s own shape (tf2onnx's `BroadcastTo` of position embeddings) adds `y` as it is;
- `trim_outputs`: optional outputs nobody reads (`SkipLayerNormalization`'s mean, inverse
  standard deviation and sum) are not computed.
"""

from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from keras_attn_export.patterns import constant_array

if TYPE_CHECKING:
    import onnx_ir as ir

# Attention's inputs: input, weights, bias, mask_index, past, attention_bias.
# MultiHeadAttention's: query, key, value, bias, key_padding_mask, attention_bias, ...
_MASK_SLOT = {"Attention": 3, "MultiHeadAttention": 4}
_BIAS_SLOT = 5
_HUGE = 1e4  # a bias this negative is a mask, not a learned score bias


def _producer(value, op_type):
    node = None if value is None else value.producer()
    return node if node is not None and node.op_type == op_type and node.domain == "" else None


def _unsqueezed_axes(value):
    """`(source, axes)` for a chain of Unsqueezes ending in `value` (axes of the result)."""
    axes = []
    while (node := _producer(value, "Unsqueeze")) is not None:
        step = constant_array(node.inputs[1]) if len(node.inputs) > 1 else None
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
    """`(mask, c)`: the bool `(B, S)` mask behind a `(B, 1, 1, S)` bias `(Cast(mask) - 1) · c`,
    or None."""
    import onnx_ir as ir

    row, axes = _unsqueezed_axes(bias)
    if axes != [1, 2] or row.shape is None or len(row.shape) != 2:
        return None
    mul = _producer(row, "Mul")
    if mul is None:
        return None
    for sub_value, scale_value in (mul.inputs, mul.inputs[::-1]):
        sub, scale = _producer(sub_value, "Sub"), constant_array(scale_value)
        if sub is None or scale is None or scale.size != 1 or float(scale.reshape(-1)[0]) < _HUGE:
            continue
        one, cast = constant_array(sub.inputs[1]), _producer(sub.inputs[0], "Cast")
        if one is None or one.size != 1 or float(one.reshape(-1)[0]) != 1.0 or cast is None:
            continue
        mask = cast.inputs[0]
        if mask.dtype == ir.DataType.BOOL:
            return mask, float(scale.reshape(-1)[0])
    return None


def mask_index(model: "ir.Model") -> int:
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
        found = _padding_mask(node.inputs[_BIAS_SLOT])
        if found is None:
            continue
        mask, scale = found
        if mask not in as_int32:
            cast = ir.node("Cast", [mask], attributes={"to": ir.DataType.INT32})
            cast.outputs[0].name = f"{mask.name}_mask_index"
            model.graph.insert_before(node, cast)
            as_int32[mask] = cast.outputs[0]
        node.replace_input_with(slot, as_int32[mask])
        # Masked scores get -c, exactly what the bias added.
        node.attributes["mask_filter_value"] = ir.AttrFloat32("mask_filter_value", -scale)
        node.resize_inputs(_BIAS_SLOT)
        while node.inputs and node.inputs[-1] is None:
            node.resize_inputs(len(node.inputs) - 1)
        changed += 1
    return changed


def same_dims(a: Any, b: Any) -> bool:
    """Both shapes known to be equal: each axis the same int or the same named symbol."""
    if a is None or b is None or len(a) != len(b):
        return False

    def equal(x: object, y: object) -> bool:
        if isinstance(x, int) or isinstance(y, int):
            return x == y
        return getattr(x, "value", None) is not None and x == y

    return all(equal(x, y) for x, y in zip(a, b, strict=True))


def drop_redundant_expands(model: "ir.Model") -> int:
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
            same = same_dims(result.shape, other.shape)
            if same and same_dims(node.outputs[0].shape, other.shape):
                node.replace_input_with(slot, source)
                changed += 1
                break
    return changed


def trim_outputs(model: "ir.Model", op_types: Collection[str] = ("SkipLayerNormalization",)) -> int:
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


def _embedding_terms(value, terms):
    """Collects the `Gather(table, ids)` and position `Slice(table, 0, ...)` terms summed into
    `value` (through Adds) into `terms`; False where something else is added."""
    node = value.producer()
    if node is None or node.domain != "":
        return False
    if node.op_type == "Add" and len(node.inputs) == 2:
        return all(_embedding_terms(v, terms) for v in node.inputs)
    table = constant_array(node.inputs[0]) if node.inputs else None
    if table is None or table.ndim != 2:
        return False
    if node.op_type == "Gather" and node.attributes.get_int("axis", 0) == 0:
        terms.setdefault("gathers", []).append(node)
        return True
    if node.op_type == "Slice" and "slice" not in terms:
        starts = constant_array(node.inputs[1])
        steps = constant_array(node.inputs[4]) if len(node.inputs) > 4 else None
        if starts is None or starts.any() or (steps is not None and (steps != 1).any()):
            return False
        terms["slice"] = node
        return True
    return False


def embed_layer_norm(model: "ir.Model") -> int:
    """`SkipLayerNormalization` of summed token, position (rows 0..S-1) and segment lookups
    becomes onnxruntime's `EmbedLayerNormalization` (the PyTorch path's graph has one);
    returns how many."""
    import onnx_ir as ir

    changed = 0
    for node in list(model.graph):
        if node.op_type != "SkipLayerNormalization" or node.domain != "com.microsoft":
            continue
        if any(v is not None for v in node.inputs[4:]) or len(node.outputs) != 1:
            continue  # a projection bias, or statistics someone reads
        terms: dict = {}
        if not all(_embedding_terms(v, terms) for v in node.inputs[:2]):
            continue
        gathers, position = terms.get("gathers", []), terms.get("slice")
        if position is None or len(gathers) not in (1, 2):
            continue
        gathers.sort(key=lambda g: -g.inputs[0].const_value.shape[0])  # the vocabulary first
        ids = [g.inputs[1] for g in gathers]
        if any(i.dtype != ir.DataType.INT32 or i.shape is None or len(i.shape) != 2 for i in ids):
            continue
        # Positions 0..S-1 of a (P, H) table: the slice is as long as the ids.
        sliced, table = position.outputs[0].shape, position.inputs[0].const_value.shape
        if sliced is None or not same_dims(sliced, [ids[0].shape[1], table[1]]):
            continue
        segment = (ids[1], gathers[1].inputs[0]) if len(gathers) == 2 else (None, None)
        fused = ir.node(
            "EmbedLayerNormalization",
            [ids[0], segment[0], gathers[0].inputs[0], position.inputs[0], segment[1],
             node.inputs[2], node.inputs[3]],
            attributes={"epsilon": node.attributes.get_float("epsilon", 1e-12)},
            domain="com.microsoft",
            num_outputs=2,  # onnxruntime's shape inference wants the mask index named
        )  # fmt: skip
        model.graph.insert_before(node, fused)
        ir.convenience.replace_all_uses_with(node.outputs[0], fused.outputs[0])
        for index, graph_output in enumerate(model.graph.outputs):
            if graph_output is node.outputs[0]:
                model.graph.outputs[index] = fused.outputs[0]
        changed += 1
    return changed
