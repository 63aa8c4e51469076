"""Export of keras_attn models to SavedModel and ONNX, checked for parity."""

from keras_attn_export.api import export_model
from keras_attn_export.manifest import read_manifest
from keras_attn_export.parity import ParityError

__all__ = ["ParityError", "export_model", "read_manifest"]
