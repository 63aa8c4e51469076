"""ONNX export with tf2onnx, and onnxruntime sessions that feed inputs by name."""

from pathlib import Path
from typing import TYPE_CHECKING

import keras
import numpy as np

from keras_attn.layers.tracing import onnx_tracing

if TYPE_CHECKING:
    import onnxruntime as ort

MIN_OPSET, MAX_OPSET = 13, 18  # tf2onnx 1.17 refuses opset 19


def check_opset(opset: int) -> None:
    if not isinstance(opset, int) or not MIN_OPSET <= opset <= MAX_OPSET:
        raise ValueError(
            f"`opset` must be an integer in [{MIN_OPSET}, {MAX_OPSET}] (tf2onnx 1.17). "
            f"Received: opset={opset!r}"
        )


def write_onnx(model: keras.Model, path: Path, opset: int = 17) -> None:
    """Converts the model's serving function with tf2onnx and writes `path`."""
    import tf2onnx
    from keras_attn_export.saved_model import serving_function

    check_opset(opset)
    serve, signature = serving_function(model)
    with (
        onnx_tracing()
    ):  # attention as MatMul/Softmax nodes that `keras_attn_export.optimize` fuses
        proto, _ = tf2onnx.convert.from_function(serve, input_signature=signature, opset=opset)
    with open(path, "wb") as f:
        f.write(proto.SerializeToString())


def run_onnx(
    session: "ort.InferenceSession", feeds: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Runs an onnxruntime session with inputs matched by name (conversion routes reorder them)."""
    names = [o.name for o in session.get_outputs()]
    expected = {i.name for i in session.get_inputs()}
    if set(feeds) != expected:
        raise ValueError(f"ONNX inputs are {sorted(expected)}. Received: {sorted(feeds)}")
    return dict(zip(names, session.run(names, feeds), strict=True))
