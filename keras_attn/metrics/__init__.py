"""Metrics: Keras metrics for training, and evaluation functions for tags, answers and text."""

from keras_attn.metrics.accuracy import MaskedAccuracy
from keras_attn.metrics.generation import (
    BERT_SCORE_LAYERS,
    bert_score,
    meteor,
    word_error_rate,
)
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
    "BERT_SCORE_LAYERS",
    "MaskedAccuracy",
    "Perplexity",
    "bert_score",
    "bleu",
    "entity_f1",
    "exact_match",
    "meteor",
    "normalize_answer",
    "rouge",
    "token_f1",
    "word_error_rate",
]
