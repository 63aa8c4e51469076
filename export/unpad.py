"""Padding-free encoders: the fused graph computes its per-position work on real tokens only.

A batch of mixed-length rows padded to the longest spends most of its projections, feed-forward
and LayerNorms on padding (82% on arrival-order batches of real sentences). `unpad` rewrites a
fused encoder (`keras_attn_export.optimize.fuse`) so that every operator that works position by
position runs on the real tokens alone, packed as one `(1, N, width)` row, N the number of real
tokens in the batch: the tokens are gathered once after the embeddings, scattered back into the
padded `(B, T, width)` layout just for attention (the only step that mixes positions), gathered
again after it, and scattered once more for the outputs. PyTorch's nested-tensor encoder and
onnxruntime's CUDA-only `RemovePadding`/`RestorePadding` do the same; this uses standard ONNX
operators (NonZero, CumSum, Gather, Pad), so it runs on the CPU provider.

Kept are the real positions and each row's first (a [CLS] pooler reads it, so it is computed
even where it is padding). Their values are unchanged; the outputs that are scattered are zero
at the other positions (Keras computes numbers there that no real token reads). The pass
applies when every attention node takes the same 2-D padding mask index (what
`passes.mask_index` writes), no cache and no bias, and nothing but attention, a first-position
pooler, a product with the padding mask (mean pooling, masked span logits) or a graph output
reads a value that changed at padding; otherwise it changes nothing.
"""

from typing import TYPE_CHECKING, Any

import numpy as np
from keras_attn_export.passes import same_dims
from keras_attn_export.patterns import constant_array

if TYPE_CHECKING:
    import onnx_ir as ir

_ATTENTION = {"Attention": 3, "MultiHeadAttention": 4}  # op -> its 2-D mask index slot
_UNARY = {"Tanh", "Relu", "Erf", "Sigmoid", "Cast", "Sqrt", "Neg", "Identity", "Softplus"}
_BINARY = {"Add", "Sub", "Mul", "Div"}
_MS_POSITIONWISE = {"SkipLayerNormalization", "BiasGelu", "Gelu", "FastGelu", "FusedMatMul",
                    "QuickGelu", "SkipSimplifiedLayerNormalization"}  # fmt: skip


def _is_constant(value):
    return value is not None and constant_array(value) is not None


def _rank(value):
    return None if value is None or value.shape is None else len(value.shape)


def _positionwise(node, packed, positions):
    """Whether `node` works on each position alone, so it may run on packed tokens: its
    inputs that are not packed are constants of rank <= 1 (they broadcast along the last
    axis) or tensors with one row per position (`(B, T, k)`, `positions` = `(B, T)`)."""
    op, domain = node.op_type, node.domain
    if domain == "" and op in _UNARY:
        return True
    if domain == "" and op == "LayerNormalization":
        axis, rank = node.attributes.get_int("axis", -1), _rank(node.inputs[0])
        return axis == -1 or (rank is not None and axis == rank - 1)
    if domain == "" and op == "MatMul":
        weight = constant_array(node.inputs[1])
        return node.inputs[0] in packed and weight is not None and weight.ndim == 2
    if (domain == "" and op in _BINARY) or (domain == "com.microsoft" and op in _MS_POSITIONWISE):
        if op == "FusedMatMul":
            weight = constant_array(node.inputs[1])
            if node.inputs[0] not in packed or weight is None or weight.ndim != 2:
                return False
            return not node.attributes.get_int("transA", 0)
        for value in node.inputs:
            if value is None or value in packed:
                continue
            array = constant_array(value)
            if array is not None:
                if array.ndim > 1:
                    return False
            elif _rank(value) != 3 or not same_dims(value.shape[:2], positions):
                return False
        return True
    return False


def padding_rule(mask: "ir.Value") -> tuple[str, int] | None:
    """`(input name, pad value)` when the bool `mask` is `input != pad value` for a graph
    input, or that input reshaped (`Not(Equal(x, c))`, `NotEqual(x, c)`, or `Cast(x, bool)`
    with c = 0), else None: which positions are real, for the parity check and the manifest
    (the last axis of the input is the position's)."""
    node = mask.producer()
    if node is not None and node.op_type == "Cast":
        source, pad = node.inputs[0], 0
    else:
        if node is not None and node.op_type == "Not":
            node = node.inputs[0].producer() if node.inputs[0] is not None else None
            if node is None or node.op_type != "Equal":
                return None
        elif node is None or node.op_type != "NotEqual":
            return None
        pairs = [(v, constant_array(v)) for v in node.inputs]
        inputs = [v for v, c in pairs if c is None]
        constants = [c for _, c in pairs if c is not None]
        if len(inputs) != 1 or len(constants) != 1 or constants[0].size != 1:
            return None
        source, pad = inputs[0], int(constants[0].reshape(-1)[0])
    merged = source.producer() if source is not None else None
    if merged is not None and merged.op_type == "Reshape" and merged.domain == "":
        source = merged.inputs[0]  # choices merged into the batch: (B, C, T) -> (B * C, T)
    if source is None or source.producer() is not None or source.name is None:
        return None  # computed inside the graph, not a graph input
    return source.name, pad


def _stream_start(query):
    """The value the first attention's `query` is projected from (back through a bias or
    scale by constants, then a MatMul by a constant 2-D weight), or `query` itself: with
    q, k and v as separate MatMuls (`fuse(pack_qkv=False)`) the first block's projections
    then run on the kept tokens too."""
    value = query
    for _ in range(4):
        node = value.producer() if value is not None else None
        if node is None or node.domain != "":
            return query
        if node.op_type == "MatMul":
            weight = constant_array(node.inputs[1])
            return node.inputs[0] if weight is not None and weight.ndim == 2 else query
        if node.op_type not in ("Add", "Mul") or len(node.inputs) != 2:
            return query
        arrays = [constant_array(v) for v in node.inputs]
        others = [v for v, array in zip(node.inputs, arrays, strict=True) if array is None]
        if len(others) != 1 or any(a is not None and a.ndim > 1 for a in arrays):
            return query
        value = others[0]
    return query


def _mask_of(model):
    """The one bool `(B, T)` padding mask every attention node reads, those nodes, and the
    `(B, T, width)` value the packed stream starts from (`_stream_start`)."""
    import onnx_ir as ir

    nodes, masks = [], set()
    for node in model.graph:
        slot = _ATTENTION.get(node.op_type)
        if slot is None or node.domain != "com.microsoft":
            continue
        if len(node.inputs) <= slot or any(v is not None for v in node.inputs[slot + 1 :]):
            return None, [], None  # a cache, an attention bias: leave the graph alone
        index = node.inputs[slot]
        cast = None if index is None else index.producer()
        if cast is None or cast.op_type != "Cast" or cast.inputs[0].dtype != ir.DataType.BOOL:
            return None, [], None
        if node.attributes.get_int("unidirectional", 0):
            return None, [], None
        masks.add(cast.inputs[0])
        nodes.append(node)
    if len(masks) != 1:
        return None, [], None
    (mask,) = masks
    if _rank(mask) != 2 or padding_rule(mask) is None:
        return None, [], None
    query = nodes[0].inputs[0]
    for start in dict.fromkeys((_stream_start(query), query)):
        if _rank(start) == 3 and same_dims(start.shape[:2], mask.shape):
            return mask, nodes, start
    return None, [], None  # the first attention's query is not one row per masked position


def _reads_first_position(node):
    """`node` reads position 0 of its `(B, T, ...)` input alone (a [CLS] pooler): position 0
    is kept in every row, so it reads what Keras computes."""
    if node.domain != "":
        return False
    if node.op_type == "Gather":
        index = constant_array(node.inputs[1])
        if node.attributes.get_int("axis", 0) != 1 or index is None or index.size != 1:
            return False
        return int(index.reshape(-1)[0]) == 0
    if node.op_type != "Slice" or len(node.inputs) < 4:
        return False
    starts, ends, axes = (constant_array(v) for v in node.inputs[1:4])
    steps = constant_array(node.inputs[4]) if len(node.inputs) > 4 else None
    if starts is None or ends is None or axes is None or (steps is not None and (steps != 1).any()):
        return False
    bounds = zip(starts.reshape(-1), ends.reshape(-1), strict=True)
    cut = dict(zip(axes.reshape(-1).tolist(), bounds, strict=True))
    return 1 in cut and int(cut[1][0]) == 0 and int(cut[1][1]) == 1


def _zeroes_padding(node, stream, mask):
    """`node` multiplies a stream value by the padding mask as a float `(B, T, 1)`
    (`Cast(Unsqueeze(mask, [-1]))` in either order: mean pooling's sum, a head's logits masked
    before a softmax): its output is zero at every padded position whatever the stream holds
    there, and Keras's value at the others."""
    if node.domain != "" or node.op_type != "Mul" or len(node.inputs) != 2:
        return False
    others = [v for v in node.inputs if v not in stream]
    if len(others) != 1 or others[0] is None:
        return False
    value, steps = others[0], []
    while value is not None and value is not mask and len(steps) < 2:
        step = value.producer()
        if step is None or step.domain != "" or step.op_type not in ("Cast", "Unsqueeze"):
            return False
        if step.op_type == "Unsqueeze":
            axes = constant_array(step.inputs[1]) if len(step.inputs) > 1 else None
            if axes is None or axes.size != 1 or int(axes.reshape(-1)[0]) not in (2, -1):
                return False
        elif step.attributes.get_int("to", 0) not in (1, 10, 11, 16):  # float types
            return False
        steps.append(step.op_type)
        value = step.inputs[0]
    return value is mask and sorted(steps) == ["Cast", "Unsqueeze"]


def _plan(graph, start, attention, positions, masking=frozenset()):
    """The rewrite, decided before any node changes: `[(node, kind)]` in graph order for the
    nodes that read the packed stream (kind `"positionwise"`, `"attention"` or `"reader"`),
    or `(None, stream, node)` with the first node that would see a changed value at a kept
    position. Values of the stream change at padding (zeros there, or attention over zeros),
    so their readers must be position-wise (rewritten), attention with this padding mask
    (padding keys are masked; `"self-attention"`, whose queries are the stream, joins it), a
    first-position pooler, one of the `masking` products (`_zeroes_padding`), or outputs."""
    stream, plan = {start}, []
    for node in graph:
        if not any(v in stream for v in node.inputs):
            continue
        if node in masking:
            plan.append((node, "reader"))
        elif _positionwise(node, stream, positions):
            stream.update(node.outputs)
            plan.append((node, "positionwise"))
        elif node in attention:
            query = node.inputs[0]
            if query in stream and same_dims(query.shape[:2] if query.shape else None, positions):
                stream.add(node.outputs[0])
                plan.append((node, "self-attention"))
            else:
                plan.append((node, "attention"))
        elif _reads_first_position(node):
            plan.append((node, "reader"))
        else:
            return None, stream, node
    return plan, stream, None


def _planned(graph, start, attention, mask):
    """`_plan`, where a product with the mask that zeroes padding becomes a reader when what
    follows it cannot run packed (mean pooling's sum, the span logits' slices): it runs on
    the padded layout, where its output is Keras's at every position. Inside the encoder such
    a product (attention's output masked) stays position-wise."""
    masking: set = set()
    while True:
        plan, stream, refused = _plan(graph, start, attention, mask.shape, frozenset(masking))
        if refused is None:
            return plan
        found, values, seen = None, [v for v in refused.inputs if v in stream], set()
        while values and found is None and len(seen) < 8:  # back along the stream, nearest first
            node = values.pop(0).producer()
            if node is None or node in seen:
                continue
            seen.add(node)
            if node not in masking and _zeroes_padding(node, stream, mask):
                found = node
            values.extend(v for v in node.inputs if v in stream)
        if found is None:
            return None
        masking.add(found)


def unpad(model: "ir.Model") -> dict | None:
    """Rewrites a fused encoder to compute per-position work on kept tokens only (module
    docstring); returns `{"input", "pad_token_id", "outputs"}` (which positions are padding, and
    the graph outputs now zero there), or None when the graph is left as it was."""
    import onnx_ir as ir

    mask, attention, start = _mask_of(model)
    if mask is None:
        return None
    plan = _planned(model.graph, start, attention, mask)
    if plan is None:
        return None
    graph = model.graph

    def make(op: str, inputs: list, domain: str = "", **attributes: Any) -> "ir.Value":
        node = ir.node(op, inputs, attributes=attributes, domain=domain)
        graph.append(node)  # placed by the topological sort at the end
        return node.outputs[0]

    def constant(array: object) -> "ir.Value":
        return make("Constant", [], value=ir.tensor(np.asarray(array, np.int64)))

    # Kept: the real positions, and each row's first (a [CLS] pooler reads it; with left
    # padding or a row of padding alone it is computed as Keras computes it).
    length = make("Squeeze", [make("Shape", [mask], start=1, end=2), constant([0])])
    first = make("Equal", [make("Range", [constant(0), length, constant(1)]), constant(0)])
    flat_mask = make("Reshape", [make("Or", [mask, first]), constant([-1])])
    where = make("NonZero", [flat_mask])  # (1, N): the kept positions of the flat batch
    count = make("Shape", [where], start=1)  # (1,) = N
    place = make("Sub", [make("CumSum", [make("Cast", [flat_mask], to=ir.DataType.INT64),
                                          constant(0)]), constant([1])])  # fmt: skip
    # Each (b, t) reads its packed row, or row N (the zero row `Pad` appends) where padding.
    inverse = make("Reshape", [make("Where", [flat_mask, place, count]), make("Shape", [mask])])

    def gather(value: "ir.Value") -> "ir.Value":  # (B, T, width) -> (1, N, width)
        return make("Gather", [make("Flatten", [value], axis=2), where], axis=0)

    def scatter(value: "ir.Value") -> "ir.Value":  # (1, N, width) -> (B, T, width), 0 at padding
        rows = make("Pad", [make("Squeeze", [value, constant([0])]), constant([0, 0, 1, 0])])
        return make("Gather", [rows, inverse], axis=0)

    packed = {start: gather(start)}  # stream value -> its packed value
    side: dict = {}  # a per-position input still padded (the row mask) -> gathered
    gone: set = set()  # stream values no longer computed padded
    padded: dict = {}  # gone value -> its scattered copy
    for node, kind in plan:
        if kind == "positionwise":
            inputs = []
            for value in node.inputs:
                if value is None or value in packed or _is_constant(value):
                    inputs.append(packed.get(value, value))
                    continue
                if value not in side:
                    side[value] = gather(value)
                inputs.append(side[value])
            attributes = dict(node.attributes)
            if node.op_type == "LayerNormalization":
                attributes["axis"] = ir.AttrInt64("axis", -1)
            new = ir.node(node.op_type, inputs, attributes=attributes, domain=node.domain,
                          num_outputs=len(node.outputs))  # fmt: skip
            graph.append(new)
            for old, value in zip(node.outputs, new.outputs, strict=True):
                packed[old] = value
                gone.add(old)
            continue
        for slot, value in enumerate(node.inputs):
            if value in gone:
                if value not in padded:
                    padded[value] = scatter(packed[value])
                node.replace_input_with(slot, padded[value])
        if kind == "self-attention":
            packed[node.outputs[0]] = gather(node.outputs[0])
    outputs: list[str] = []
    for index, value in enumerate(list(graph.outputs)):
        if value not in gone:
            continue
        if value not in padded:
            padded[value] = scatter(packed[value])
        out = padded[value]
        if value.name is not None and value.name not in outputs:  # the first time it is listed
            outputs.append(value.name)
            name, value.name = value.name, None
            out.name, out.type, out.shape = name, value.type, value.shape
        graph.outputs[index] = out
    graph.sort()
    input_name, pad_token_id = padding_rule(mask)  # type: ignore[misc]
    return {"input": input_name, "pad_token_id": pad_token_id, "outputs": outputs}
