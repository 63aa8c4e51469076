"""Models composed from keras_attn layers with the functional API."""

from keras_attn.models.causal_lm import build_causal_lm, lm_loss

__all__ = ["build_causal_lm", "lm_loss"]
