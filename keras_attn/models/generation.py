"""Generation with model-level functions: for a `CausalLM` or a user's functional causal LM made
of our layers (the contract of `keras_attn.decoding.stack`)."""

from keras_attn.decoding import CausalLMRunner
from keras_attn.decoding import generate as generate_ids


def greedy_generate(model, prompts, max_new_tokens, pad_id=0, use_cache=True):
    """Greedy continuation of id prompts of any lengths; see `keras_attn.decoding.generate`."""
    return generate_ids(
        CausalLMRunner(model), prompts, max_new_tokens, pad_id=pad_id, use_cache=use_cache
    )


def generate(model, prompts, max_new_tokens, **kwargs):
    """Continues id prompts with any sampler; `kwargs` as `keras_attn.decoding.generate`
    (`sampler`, `temperature`, `top_k`, `top_p`, `num_beams`, `stop_token_ids`, `seed`, ...).

    Works for a `CausalLM` and for a functional causal LM built from our layers. Where id 0
    is a real token (`mask_zero=False`, GPT-2), the last id pads the decoding buffer instead
    and is the one never generated.
    """
    runner = CausalLMRunner(model)
    if not runner.mask_zero:
        kwargs.setdefault("pad_id", runner.token_embedding.vocabulary_size - 1)
    return generate_ids(runner, prompts, max_new_tokens, **kwargs)
