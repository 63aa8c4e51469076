"""Preprocessing layers: packing ids into model inputs, masked-LM corruption."""

from keras_attn.preprocessing.masked_lm import MaskedLMMaskGenerator
from keras_attn.preprocessing.packers import SegmentPacker, StartEndPacker
from keras_attn.preprocessing.preprocessor import (
    CausalLMPreprocessor,
    MaskedLMPreprocessor,
    TextPreprocessor,
)
from keras_attn.preprocessing.seq2seq import Seq2SeqLMPreprocessor

__all__ = [
    "CausalLMPreprocessor",
    "MaskedLMMaskGenerator",
    "MaskedLMPreprocessor",
    "SegmentPacker",
    "Seq2SeqLMPreprocessor",
    "StartEndPacker",
    "TextPreprocessor",
]
