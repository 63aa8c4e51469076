"""Decoding: cached step functions per model family, samplers, and the search loops."""

from keras_attn.decoding.runners import CausalLMRunner, Seq2SeqRunner, select_rows
from keras_attn.decoding.samplers import Sampler, top_k_filter, top_p_filter
from keras_attn.decoding.search import beam_search, generate, length_normalized

__all__ = [
    "CausalLMRunner",
    "Sampler",
    "Seq2SeqRunner",
    "beam_search",
    "generate",
    "length_normalized",
    "select_rows",
    "top_k_filter",
    "top_p_filter",
]
