"""Decoding over a model's cached call: samplers and the search loops. Model-agnostic: a model
hands in a `Runner` of its own callables (`CausalLM.runner()`, `Seq2Seq.runner(...)`)."""

from keras_attn.decoding.beam import banned_ngram_ids, beam_search, length_normalized
from keras_attn.decoding.runners import Runner, select_rows
from keras_attn.decoding.samplers import Sampler, top_k_filter, top_p_filter
from keras_attn.decoding.search import as_prompts, decode

__all__ = [
    "Runner",
    "Sampler",
    "as_prompts",
    "banned_ngram_ids",
    "beam_search",
    "decode",
    "length_normalized",
    "select_rows",
    "top_k_filter",
    "top_p_filter",
]
