"""Models composed from keras_attn layers with the functional API."""

from keras_attn.models.causal_lm import build_causal_lm, lm_loss
from keras_attn.models.generation import CachedCausalLM, greedy_generate

__all__ = ["CachedCausalLM", "build_causal_lm", "greedy_generate", "lm_loss"]
