"""Export of keras_attn models to SavedModel and ONNX, checked for parity."""

from export.api import export_model
from export.manifest import read_manifest
from export.parity import ParityError

__all__ = ["ParityError", "export_model", "read_manifest"]
