"""onnxruntime inference for exported keras_attn models. Never imports tensorflow or keras.

Names load on first use, so `keras_attn_serving.manifest` (the schema export writes) imports
without onnxruntime or tokenizers installed."""

import importlib

_NAMES = {
    "ArtifactError": "keras_attn_serving.manifest",
    "Manifest": "keras_attn_serving.manifest",
    "read_manifest": "keras_attn_serving.manifest",
    "Predictor": "keras_attn_serving.predictor",
    "JsonTextTokenizer": "keras_attn_serving.tokenizer",
    "WordPieceTextTokenizer": "keras_attn_serving.tokenizer",
    "load_text_tokenizer": "keras_attn_serving.tokenizer",
}

__all__ = sorted(_NAMES)


def __getattr__(name):
    if name not in _NAMES:
        raise AttributeError(f"module 'keras_attn_serving' has no attribute {name!r}")
    return getattr(importlib.import_module(_NAMES[name]), name)


def __dir__():
    return __all__
