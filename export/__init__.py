"""Export of keras_attn models to SavedModel and ONNX (built in the export issue)."""
