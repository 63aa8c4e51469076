"""Metrics: Keras metrics for training, and evaluation functions for tags, answers and text."""

from keras_attn.metrics.accuracy import MaskedAccuracy
from keras_attn.metrics.perplexity import Perplexity
from keras_attn.metrics.text import (
    bleu,
    entity_f1,
    exact_match,
    normalize_answer,
    rouge,
    token_f1,
)

__all__ = [
    "MaskedAccuracy",
    "Perplexity",
    "bleu",
    "entity_f1",
    "exact_match",
    "normalize_answer",
    "rouge",
    "token_f1",
]
