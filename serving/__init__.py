"""onnxruntime inference for exported keras_attn models. Never imports tensorflow or keras."""

from serving.manifest import ArtifactError, read_manifest
from serving.predictor import Predictor
from serving.tokenizer import WordPieceTextTokenizer

__all__ = ["ArtifactError", "Predictor", "WordPieceTextTokenizer", "read_manifest"]
