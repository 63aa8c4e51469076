"""One padding-free encoder graph that projects queries, keys and values on real tokens where
that pays, chosen per batch by its padding share.

The padding-free fusion (`keras_attn_export.unpad`) can leave an attention's q, k and v in
onnxruntime's packed `Attention` (one `(d, 3d)` matmul over every position of the padded
`(B, T)` layout) or project them on the kept tokens alone (`fuse(pack_qkv=False)`) and scatter
each into the padded layout for `MultiHeadAttention` (onnxruntime's CPU `MultiHeadAttention`
takes no packed q/k/v). The second computes less where a batch is mostly padding, and pays its
scatters and the unpacked operator where it is not: on MiniLM-L6 (2-core Xeon) it ran 1.08x the
packed graph at 82% padding and 0.86-1.01x at 0-20% (`bench/unpad.py`).

`switch` writes both behind one ONNX `If` on the batch's padding share (the share of the
padding input's values that are its padding id): above the threshold, the branch with q, k
and v unpadded; otherwise the packed one. The weights live in the outer graph, each content
once, so the branches share all but the packed q/k/v weight (MiniLM-L6's file grew 0.03%:
its packed weights are concatenated at load; where a fusion folds them into one constant,
q, k and v are stored twice). The threshold is the scalar initializer `THRESHOLD`: `measure`
times both branches on the exporting CPU at half padding and more (`choose`), and
`with_threshold` sets it (-1 runs the unpadded branch always, 1 never).
"""

import hashlib
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import keras
    import onnx

THRESHOLD = "qkv_switch/threshold"  # the initializer holding the padding share
SWITCH = "qkv_switch"  # the If node's name
BRANCHES = {"unpadded": "then_branch", "packed": "else_branch"}  # q/k/v -> the If's attribute
ALWAYS, NEVER = -1.0, 1.0  # thresholds that force each branch
PREFIXES = ("packed/", "unpadded/", "qkv_switch/")  # names the switched graph adds


def switch(
    packed: "onnx.ModelProto", unpadded: "onnx.ModelProto", rule: dict, threshold: float = 0.5
) -> "onnx.ModelProto | None":
    """`packed` and `unpadded` (two fusions of one graph, with the same inputs, outputs and
    padding `rule`) as one graph that runs `unpadded` where more than `threshold` of the
    padding input is padding; None where they cannot share one: their inputs, outputs or
    padding rules differ, a node holds a subgraph, a graph output is an input or a constant,
    a name is one the switch adds, or the two would not fit in one protobuf (2 GB)."""
    import onnx
    from keras_attn_export.graph_meta import padding_rule
    from onnx import TensorProto, helper, numpy_helper

    _check_threshold(threshold)
    graphs = {"packed": packed.graph, "unpadded": unpadded.graph}
    signature = [[(v.name, v.type.SerializeToString()) for v in (*g.input, *g.output)]
                 for g in graphs.values()]  # fmt: skip
    if signature[0] != signature[1] or padding_rule(unpadded) != rule:
        return None
    for model, graph in zip((packed, unpadded), graphs.values(), strict=True):
        stored = {t.name for t in graph.initializer} | {t.name for t in graph.sparse_initializer}
        names = [v.name for v in (*graph.input, *graph.output)]
        produced = {out for node in graph.node for out in node.output}
        if (model.functions or graph.sparse_initializer or stored & set(names)
                or any(v.name not in produced for v in graph.output)
                or any(name.startswith(PREFIXES) for name in names)
                or any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                       for node in graph.node for a in node.attribute)):  # fmt: skip
            return None
    source = {v.name: v for v in packed.graph.input}.get(rule["input"])
    if source is None:
        return None
    weights: dict[str, onnx.TensorProto] = {}  # content hash -> the one outer initializer
    branches = {kind: _branch(graph, kind, weights) for kind, graph in graphs.items()}
    dtype = helper.tensor_dtype_to_np_dtype(source.type.tensor_type.elem_type)
    constants = [
        numpy_helper.from_array(np.asarray(rule["pad_token_id"], dtype), "qkv_switch/pad_id"),
        numpy_helper.from_array(np.asarray(threshold, np.float32), THRESHOLD),
    ]
    nodes = [
        helper.make_node("Equal", [source.name, "qkv_switch/pad_id"], ["qkv_switch/is_pad"]),
        helper.make_node("Cast", ["qkv_switch/is_pad"], ["qkv_switch/pad"], to=TensorProto.FLOAT),
        helper.make_node("ReduceMean", ["qkv_switch/pad"], ["qkv_switch/share"], keepdims=0),
        helper.make_node("Greater", ["qkv_switch/share", THRESHOLD], ["qkv_switch/heavy"]),
        helper.make_node("If", ["qkv_switch/heavy"], [v.name for v in packed.graph.output],
                         name=SWITCH, then_branch=branches["unpadded"],
                         else_branch=branches["packed"]),
    ]  # fmt: skip
    graph = helper.make_graph(nodes, packed.graph.name, list(packed.graph.input),
                              list(packed.graph.output),
                              [*weights.values(), *constants])  # fmt: skip
    opsets: dict[str, int] = {}
    for opset in (*packed.opset_import, *unpadded.opset_import):
        opsets[opset.domain] = max(opsets.get(opset.domain, 0), opset.version)
    model = helper.make_model(
        graph,
        ir_version=max(packed.ir_version, unpadded.ir_version),
        opset_imports=[helper.make_opsetid(domain, v) for domain, v in opsets.items()],
        producer_name=packed.producer_name,
        producer_version=packed.producer_version,
    )
    model.metadata_props.extend(packed.metadata_props)
    if model.ByteSize() >= 2**31:  # a protobuf holds under 2 GB; the graphs are written whole
        return None
    onnx.checker.check_model(model)
    return model


def _check_threshold(threshold: float) -> None:
    if not -1.0 <= threshold <= 1.0:  # NaN too
        raise ValueError(
            "`threshold` is a share of padding, from -1 (always unpadded) to 1 (never). "
            f"Received: threshold={threshold}"
        )


def _branch(graph: "onnx.GraphProto", kind: str, weights: dict) -> "onnx.GraphProto":
    """`graph`'s nodes as an If branch: its initializers moved to `weights` (one per content,
    so both branches share what they both hold), its values named `kind/...` apart from the
    graph's inputs, and its outputs those values."""
    import onnx
    from onnx import helper, numpy_helper

    inputs = {v.name for v in graph.input}
    renamed = {}
    for tensor in graph.initializer:
        array = numpy_helper.to_array(tensor)
        key = hashlib.sha256(f"{array.dtype}{array.shape}".encode() + array.tobytes()).hexdigest()
        if key not in weights:
            weights[key] = numpy_helper.from_array(array, f"qkv_switch/w{len(weights)}")
        renamed[tensor.name] = weights[key].name

    def name(value: str) -> str:
        if not value or value in inputs:
            return value
        return renamed.get(value, f"{kind}/{value}")

    nodes = []
    for node in graph.node:
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.name = f"{kind}/{node.name}"
        copy.input[:] = [name(v) for v in node.input]
        copy.output[:] = [name(v) for v in node.output]
        nodes.append(copy)
    outputs = []
    for value in graph.output:
        copy = onnx.ValueInfoProto()
        copy.CopyFrom(value)
        copy.name = name(value.name)
        outputs.append(copy)
    return helper.make_graph(nodes, f"{kind}_qkv", [], outputs)


def find(model: "onnx.ModelProto") -> "onnx.NodeProto | None":
    """The switch's If node of a graph `switch` wrote, else None."""
    return next((n for n in model.graph.node if n.op_type == "If" and n.name == SWITCH), None)


def branch(model: "onnx.ModelProto", kind: str) -> "onnx.GraphProto":
    """The `"packed"` or `"unpadded"` branch of a switched graph (for counting operators)."""
    if kind not in BRANCHES:
        raise ValueError(f"`kind` is 'packed' or 'unpadded'. Received: kind={kind!r}")
    node = find(model)
    if node is None:
        raise ValueError("`model` has no q/k/v switch (`qkv_switch.switch` writes one)")
    (graph,) = [a.g for a in node.attribute if a.name == BRANCHES[kind]]
    return graph


def threshold(model: "onnx.ModelProto") -> float | None:
    """The padding share above which a switched graph runs the unpadded branch, else None."""
    from onnx import numpy_helper

    for tensor in model.graph.initializer:
        if tensor.name == THRESHOLD and find(model) is not None:
            return float(numpy_helper.to_array(tensor))
    return None


def with_threshold(model: "onnx.ModelProto", share: float) -> "onnx.ModelProto":
    """A copy of the switched `model` whose threshold is `share` (`ALWAYS`, `NEVER` force a
    branch)."""
    import onnx
    from onnx import numpy_helper

    _check_threshold(share)
    if threshold(model) is None:
        raise ValueError("`model` has no q/k/v switch (`qkv_switch.switch` writes one)")
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for tensor in copy.graph.initializer:
        if tensor.name == THRESHOLD:
            tensor.CopyFrom(numpy_helper.from_array(np.asarray(share, np.float32), THRESHOLD))
    return copy


def branch_sessions(model: "onnx.ModelProto") -> dict:
    """`{"packed": session, "unpadded": session}`: the switched `model` with each branch
    forced, for parity checks and timing."""
    import onnxruntime as ort

    return {
        kind: ort.InferenceSession(with_threshold(model, share).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
        for kind, share in (("packed", NEVER), ("unpadded", ALWAYS))
    }  # fmt: skip


def measure(
    model: "onnx.ModelProto",
    feeds: dict[float, dict[str, np.ndarray]],
    run: Callable,
    rounds: int = 5,
) -> dict:
    """Times both branches of the switched `model` on `feeds` (`{padding share: feeds}`),
    interleaved, medians of `rounds`; returns the manifest's record, with the threshold
    `choose` reads from the timings."""
    sessions = branch_sessions(model)
    for session in sessions.values():
        for feed in feeds.values():
            run(session, feed)  # warm-up
    times: dict[tuple[str, float], list[float]] = {}
    for _ in range(rounds):
        for kind, session in sessions.items():
            for share, feed in feeds.items():
                start = time.perf_counter()
                run(session, feed)
                times.setdefault((kind, share), []).append((time.perf_counter() - start) * 1e3)
    ms = {key: float(np.median(values)) for key, values in times.items()}
    timings = [{"padding": round(share, 4), "packed_ms": round(ms[("packed", share)], 3),
                "unpadded_ms": round(ms[("unpadded", share)], 3)}
               for share in sorted(feeds)]  # fmt: skip
    return {"threshold": choose(timings), "chosen_by": "measurement", "timings": timings}


def choose(timings: list[dict], margin: float = 1.02) -> float:
    """The threshold from `timings` (`[{"padding", "packed_ms", "unpadded_ms"}]`, lightest
    padding first): of those at half padding or more (0.45, for rounding), `NEVER` unless the
    unpadded branch is `margin` faster at the heaviest; else the lightest share from which on
    it is nowhere slower (the unpadded branch runs above it).

    Nothing under half padding counts. On MiniLM-L6 (2-core Xeon, `bench/unpad.py`) the
    unpadded branch was 2.7% faster on 8 rows of 64 positions at 25% padding, yet 2-14%
    slower on length-sorted and full batches of real text at 0-20%: the gains of small shapes
    at light padding do not carry to real batches. At 51% it was 1.02x on 8 rows, at 75%
    1.13x, and 1.08x on arrival-order batches at 82%."""
    heavy = [t for t in timings if t["padding"] >= 0.45]
    if not heavy or heavy[-1]["packed_ms"] <= margin * heavy[-1]["unpadded_ms"]:
        return NEVER
    chosen = heavy[-1]["padding"]
    for timing in reversed(heavy[:-1]):
        if timing["packed_ms"] < timing["unpadded_ms"]:
            break
        chosen = timing["padding"]
    return float(chosen)


def switch_qkv(
    model: "keras.Model",
    unpacked: "Callable[[], onnx.ModelProto]",
    packed: "onnx.ModelProto",
    rule: dict,
) -> tuple["onnx.ModelProto", dict | None]:
    """`(graph, record)`: the padding-free `packed` graph with q, k and v also projected on
    real tokens where a batch is mostly padding (module docstring), at the
    threshold timed here, and the manifest's record of it; `(packed, None)` where the two
    fusions cannot share one graph or onnxruntime refuses the switched one. `unpacked` makes
    the other fusion (`fuse(..., pack_qkv=False)` of the same graph)."""
    import onnx
    from keras_attn_export.onnx import run_onnx
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_errors

    refused = (ValueError, onnx.checker.ValidationError, ort_errors.Fail,
               ort_errors.InvalidGraph, ort_errors.InvalidArgument, ort_errors.NotImplemented,
               ort_errors.RuntimeException)  # fmt: skip
    try:
        feeds = switch_feeds(model, rule)
        if not feeds:
            return packed, None
        switched = switch(packed, unpacked(), rule)
        if switched is None:
            return packed, None
        record = measure(switched, feeds, run_onnx)
    except refused:
        return packed, None  # the packed graph alone, as before the switch
    return with_threshold(switched, record["threshold"]), record


def switch_feeds(model: "keras.Model", rule: dict, rows: int = 8) -> dict[float, dict]:
    """Inputs of `rows` rows, with every row but the first cut to give about 50 and 75%
    padding, by padding share: what `measure` times. Rows are up to 64 positions
    (the padding input's own length where that is fixed); fewer than 4 give no feeds."""
    from keras_attn_export.describe import max_sequence_length, max_token_id
    from keras_attn_export.parity import sample_inputs
    from keras_attn_export.saved_model import input_specs

    one = sample_inputs(input_specs(model), 1, min(64, max_sequence_length(model) or 64),
                        max_token_id(model))  # fmt: skip
    if rule["input"] not in one or one[rule["input"]].shape[-1] < 4:
        return {}
    length = one[rule["input"]].shape[-1]
    feeds = {}
    for target in (0.5, 0.75):
        cut = min(length - 1, math.ceil(target * rows * length / (rows - 1)))  # >= target
        batch = {name: np.repeat(x, rows, axis=0) for name, x in one.items()}
        for name, x in batch.items():
            aligned = x.shape[-1] == length and "position" not in name
            if name == rule["input"]:
                x[1:, ..., length - cut :] = rule["pad_token_id"]
            elif aligned and np.issubdtype(x.dtype, np.integer):
                x[1:, ..., length - cut :] = 0  # segment ids, a mask beside the ids
        feeds[float(np.mean(batch[rule["input"]] == rule["pad_token_id"]))] = batch
    return feeds
