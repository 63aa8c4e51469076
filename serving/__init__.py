"""onnxruntime inference for exported keras_attn models. Never imports tensorflow or keras."""
