"""Metrics for language models."""

from keras_attn.metrics.perplexity import Perplexity

__all__ = ["Perplexity"]
