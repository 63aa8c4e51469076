"""Greedy generation with a model-level function (kept for the functional style)."""

from keras_attn.decoding import CausalLMRunner, generate


def greedy_generate(model, prompts, max_new_tokens, pad_id=0, use_cache=True):
    """Greedy continuation of id prompts of any lengths; see `keras_attn.decoding.generate`."""
    return generate(
        CausalLMRunner(model), prompts, max_new_tokens, pad_id=pad_id, use_cache=use_cache
    )
