"""ONNX export with tf2onnx, and onnxruntime sessions that feed inputs by name."""

import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import keras
import numpy as np

from keras_attn.layers.tracing import onnx_tracing

if TYPE_CHECKING:
    import onnx
    import onnxruntime as ort

MIN_OPSET, MAX_OPSET = 13, 18  # tf2onnx 1.17 refuses opset 19


def check_opset(opset: int) -> None:
    if not isinstance(opset, int) or not MIN_OPSET <= opset <= MAX_OPSET:
        raise ValueError(
            f"`opset` must be an integer in [{MIN_OPSET}, {MAX_OPSET}] (tf2onnx 1.17). "
            f"Received: opset={opset!r}"
        )


def write_onnx(model: keras.Model, path: Path, opset: int = 17) -> None:
    """Converts the model's serving function with tf2onnx and writes `path`.

    Raises:
        ValueError: the graph uses a TensorFlow op that tf2onnx cannot convert, or
            onnxruntime cannot load the converted graph; the message names the op.
    """
    import tf2onnx
    from keras_attn_export.saved_model import serving_function

    check_opset(opset)
    serve, signature = serving_function(model)
    with (
        onnx_tracing()
    ):  # attention as MatMul/Softmax nodes that `keras_attn_export.optimize` fuses
        proto, _ = tf2onnx.convert.from_function(serve, input_signature=signature, opset=opset)
    # tf2onnx converts with `continue_on_error=True`: an op it has no mapping for (Lgamma,
    # Erfinv) only logs an error and stays in the graph under its TensorFlow name.
    unconverted = sorted(
        {node.op_type for node in _nodes(proto.graph) if not _is_onnx_op(node, opset)}
    )
    if unconverted:
        raise ValueError(
            f"tf2onnx cannot convert the TensorFlow op(s) {', '.join(unconverted)} to ONNX "
            f"(opset {opset}): export this model with formats=['saved_model'] only, or build it "
            "without those ops"
        )
    with open(path, "wb") as f:
        f.write(proto.SerializeToString())
    check_loads(path)


def check_loads(path: Path) -> None:
    """Opens `path` in onnxruntime (CPU); an op it has no kernel for becomes a `ValueError`
    naming the op, not onnxruntime's own exception with the graph's temporary path."""
    import onnxruntime as ort
    from onnxruntime.capi.onnxruntime_pybind11_state import (
        Fail,
        InvalidArgument,
        InvalidGraph,
        NotImplemented,
    )

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except (Fail, InvalidArgument, InvalidGraph, NotImplemented) as error:
        message = str(error)
        op = re.search(r"No Op registered for (\S+)|implementation for (\S+?)\(", message)
        what = f"run op {op.group(1) or op.group(2)} in" if op else "load"
        # The first line after "Load model from PATH failed:" (no temporary path).
        reason = message.split(" failed:", 1)[-1].strip().splitlines()[0][:300]
        raise ValueError(f"onnxruntime cannot {what} the exported {path.name}: {reason}") from None


def _nodes(graph: "onnx.GraphProto") -> Iterator["onnx.NodeProto"]:
    """Every node of `graph`, those in Loop/If/Scan bodies included."""
    for node in graph.node:
        yield node
        for attribute in node.attribute:
            bodies = [attribute.g] if attribute.HasField("g") else []
            for body in [*bodies, *attribute.graphs]:
                yield from _nodes(body)


def _is_onnx_op(node: "onnx.NodeProto", opset: int) -> bool:
    """True for an op in another domain (onnxruntime's contrib ops) or an ONNX op of `opset`."""
    import onnx

    if node.domain not in ("", "ai.onnx"):
        return True
    try:
        onnx.defs.get_schema(node.op_type, opset, "")
    except onnx.defs.SchemaError:
        return False
    return True


def run_onnx(
    session: "ort.InferenceSession", feeds: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Runs an onnxruntime session with inputs matched by name (conversion routes reorder them)."""
    names = [o.name for o in session.get_outputs()]
    expected = {i.name for i in session.get_inputs()}
    if set(feeds) != expected:
        raise ValueError(f"ONNX inputs are {sorted(expected)}. Received: {sorted(feeds)}")
    return dict(zip(names, session.run(names, feeds), strict=True))
