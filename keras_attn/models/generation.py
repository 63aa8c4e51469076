"""Generation for causal LMs: a `CausalLM`, or a user's functional causal LM of our layers
(`keras_attn.models.cached.FunctionalCausalLM`)."""

from keras_attn.decoding import Runner
from keras_attn.decoding import generate as generate_ids
from keras_attn.models.cached import cached_causal_lm, model_inputs


def causal_runner(model) -> Runner:
    """The decoding `Runner` of a causal LM, over its cached call."""
    lm = cached_causal_lm(model)

    def step(token_ids, state, index):
        logits, caches = lm.call_with_cache(token_ids, state["caches"], index)
        return logits, {"caches": caches}

    def full(token_ids, state):
        return model(model_inputs(model, token_ids), training=False)

    def initial_state(rows, max_length):
        return {"caches": lm.init_cache(len(rows), max_length)}

    vocabulary = lm.token_embedding.vocabulary_size
    return Runner(model, step, full, initial_state, vocabulary, lm.max_length)


def greedy_generate(model, prompts, max_new_tokens, pad_id=0, use_cache=True):
    """Greedy continuation of id prompts of any lengths; see `keras_attn.decoding.generate`."""
    return generate_ids(
        causal_runner(model), prompts, max_new_tokens, pad_id=pad_id, use_cache=use_cache
    )


def generate(model, prompts, max_new_tokens, **kwargs):
    """Continues id prompts with any sampler; `kwargs` as `keras_attn.decoding.generate`
    (`sampler`, `temperature`, `top_k`, `top_p`, `num_beams`, `stop_token_ids`, `seed`, ...).

    Works for a `CausalLM` and for a functional causal LM built from our layers. Where id 0
    is a real token (`mask_zero=False`, GPT-2), the last id pads the decoding buffer instead
    and is the one never generated.
    """
    runner = causal_runner(model)
    if not cached_causal_lm(model).zero_is_padding:
        kwargs.setdefault("pad_id", runner.vocabulary_size - 1)
    return generate_ids(runner, prompts, max_new_tokens, **kwargs)
