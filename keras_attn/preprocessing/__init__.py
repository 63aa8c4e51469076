"""Preprocessing layers: packing ids into model inputs, masked-LM corruption."""

from keras_attn.preprocessing.masked_lm import MaskedLMMaskGenerator
from keras_attn.preprocessing.packers import SegmentPacker, StartEndPacker
from keras_attn.preprocessing.preprocessor import (
    CausalLMPreprocessor,
    MaskedLMPreprocessor,
    TextPreprocessor,
)

__all__ = [
    "CausalLMPreprocessor",
    "MaskedLMMaskGenerator",
    "MaskedLMPreprocessor",
    "SegmentPacker",
    "StartEndPacker",
    "TextPreprocessor",
]
