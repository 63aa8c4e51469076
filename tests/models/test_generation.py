import keras
import numpy as np
import pytest

from keras_attn.models import build_causal_lm, generate
from tests.conftest import keras_greedy
from tests.helpers import to_numpy


@pytest.fixture(scope="module", params=["learned", "rotary"])
def lm(request):
    """Learned positions, and rotary ones with id 0 masked (the defaults): the token
    embedding's padding mask must not reach the cached attention (it covers the new tokens,
    not the cache; a prefill of several tokens failed on it)."""
    import keras

    keras.utils.set_random_seed(3)
    return build_causal_lm(50, 32, hidden_dim=16, num_layers=2, num_heads=2,
                           position_encoding=request.param)  # fmt: skip


def test_cached_logits_equal_full_recomputation_at_every_step(lm):
    ids = np.random.default_rng(0).integers(1, 50, size=(2, 9)).astype("int32")
    full = lm.predict(ids, verbose=0)
    cache = lm.init_cache(2, 9)
    logits, cache = lm.call_with_cache(ids[:, :4], cache, 0)  # prefill
    steps = [to_numpy(logits)]
    for t in range(4, 9):
        logits, cache = lm.call_with_cache(ids[:, t : t + 1], cache, t)
        steps.append(to_numpy(logits))
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=1e-4)


def test_cached_greedy_equals_uncached_and_the_reference(lm):
    prompts = [[5, 6, 7], [9, 3, 12, 4, 8], [2]]  # three lengths in one batch
    cached = generate(lm, prompts, 6)
    assert cached == generate(lm, prompts, 6, use_cache=False)
    assert cached == [keras_greedy(lm, p, 6) for p in prompts]
    assert cached == lm.generate(prompts, 6)
    assert all(len(c) == 6 and 0 not in c for c in cached)


def test_with_id_zero_a_token_every_id_can_be_generated():
    """`mask_zero=False` (GPT-2, Llama): no id is padding. GPT-2's end of text is its last id;
    it used to pad the buffer and was never generated, so it could never stop a row."""
    import keras

    keras.utils.set_random_seed(5)
    lm = build_causal_lm(3, 32, hidden_dim=16, num_layers=2, num_heads=2, mask_zero=False)
    prompts = [[0, 1], [2, 0, 0, 1]]
    cached = generate(lm, prompts, 12)
    assert cached == [keras_greedy(lm, p, 12, pad_token_id=None) for p in prompts]
    assert cached == generate(lm, prompts, 12, use_cache=False)
    # Hot sampling over 3 ids: 24 draws, each the last id about a third of the time.
    hot = {"sampler": "sample", "temperature": 10.0, "seed": 1}
    sampled = generate(lm, prompts, 12, **hot)
    assert 2 in sampled[0] + sampled[1]
    stopped = generate(lm, prompts, 12, stop_token_ids=[2], **hot)
    assert stopped == [s[: s.index(2)] if 2 in s else s for s in sampled]
    # An explicit padding id is still never generated.
    assert all(2 not in row for row in generate(lm, prompts, 12, pad_token_id=2, **hot))


def test_errors(lm):
    with pytest.raises(ValueError, match="prompts"):
        generate(lm, [[]], 3)
    with pytest.raises(ValueError, match="max_new_tokens"):
        lm.generate([[1]], 0)
    with pytest.raises(ValueError, match="sampler"):
        lm.generate([[1]], 2, sampler="nucleus")
    with pytest.raises(ValueError, match="num_beams"):
        lm.generate([[1]], 2, sampler="beam", num_beams=0)


def functional_lm(vocabulary=50, length=16, extra_layer=False, tied=True):
    """A user's own causal LM: our layers through the functional API, no CausalLM class."""
    import keras

    import keras_attn as ka

    keras.utils.set_random_seed(4)
    ids = keras.Input((None,), dtype="int32")
    embedding = ka.TokenEmbedding(vocabulary, 16, mask_zero=True)
    x = embedding(ids)
    x = keras.layers.Add()([x, ka.PositionEmbedding(length)(x)])
    for _ in range(2):
        x = ka.TransformerDecoder(num_heads=2, intermediate_dim=32, normalize_first=True)(x)
        if extra_layer:
            x = keras.layers.Activation("tanh")(x)  # not part of the contract
    x = keras.layers.LayerNormalization()(x)
    logits = embedding(x, reverse=True) if tied else keras.layers.Dense(vocabulary)(x)
    return keras.Model(ids, logits)


@pytest.mark.parametrize("tied", [True, False])
def test_functional_causal_lm_generates_like_full_recomputation(tied):
    from keras_attn.models import generate

    model = functional_lm(tied=tied)
    prompts = [[5, 6, 7], [9, 3, 12, 4, 8]]
    cached = generate(model, prompts, 5)
    assert cached == [keras_greedy(model, p, 5) for p in prompts]
    assert cached == generate(model, prompts, 5, use_cache=False)
    sampled = generate(model, prompts, 5, sampler="sample", top_k=5, seed=1)
    assert sampled == generate(
        model, prompts, 5, sampler="sample", top_k=5, seed=1, use_cache=False
    )
    beams = generate(model, [[5, 6, 7]], 4, sampler="beam", num_beams=3)
    assert len(beams[0]) == 4


def test_functional_causal_lm_attention_maps_are_causal():
    from keras_attn.visualization import attention_maps

    model = functional_lm()
    maps = attention_maps(model, np.array([[5, 6, 7, 8, 0]], "int32"))
    assert len(maps) == 2
    weights = next(iter(maps.values()))["self"]
    assert weights.shape == (1, 2, 5, 5)
    np.testing.assert_array_equal(np.triu(weights[0, 0], 1), 0.0)  # nothing from the future
    np.testing.assert_allclose(weights[0, :, :4].sum(-1), 1.0, atol=1e-5)


def test_functional_model_outside_the_contract_is_refused():
    with pytest.raises(ValueError, match="cached decoding needs a causal LM made of"):
        generate(functional_lm(extra_layer=True), [[5, 6]], 2)


@pytest.mark.parametrize("sampler", ["greedy", "sample", "beam"])
def test_generation_past_the_context_length_names_both_numbers(lm, sampler):
    with pytest.raises(
        ValueError,
        match=r"\(30 ids\) plus `max_new_tokens` \(5\) is 35, past the model's context length 32",
    ):
        lm.generate([[5] * 30], 5, sampler=sampler)
    assert len(lm.generate([[5] * 30], 2, sampler=sampler)[0]) <= 2


def test_bad_prompts_and_long_inputs_are_value_errors_not_op_errors(lm):
    """Issue 19: prompt ids past the vocabulary and inputs past the position table surfaced as
    TensorFlow op errors. (A traced call whose length is only known at run time, as in
    `predict`, still fails inside the Slice op.)"""
    with pytest.raises(
        ValueError, match=r"outside the vocabulary \[0, 50\)\. Received: \[60, 99\]"
    ):
        lm.generate([[60, 3], [99]], 2)
    if lm.position_embedding is None:  # rotary: no position table to run past
        return
    with pytest.raises(
        ValueError, match=r"up to `sequence_length=32`\. Received: inputs of length 40"
    ):
        lm(np.ones((1, 40), "int32"))


def _step_rows_apart(lm, full, target, cache=None):
    """Rows 2 and 4 ids long, one step each at its own position: logits vs `full`'s (ids
    3..15 in `target`; `cache`: the empty state, a decoder's own by default)."""
    prefill = target[:, :4].copy()
    prefill[0, 2:] = (prefill[0, 2:] - 2) % 13 + 3  # row 0's own steps overwrite these
    cache = lm.init_cache(2, 8) if cache is None else cache
    _, cache = lm.call_with_cache(prefill, cache, 0)
    for step in range(2):
        index = np.array([2, 4], "int32") + step
        tokens = target[np.arange(2), index][:, None]
        logits, cache = lm.call_with_cache(tokens, cache, keras.ops.convert_to_tensor(index))
        np.testing.assert_allclose(
            keras.ops.convert_to_numpy(logits)[:, -1], full[np.arange(2), index], atol=1e-5
        )


def test_functional_causal_lm_steps_rows_at_their_own_positions():
    import keras_attn as ka
    from keras_attn.models.cached import cached_causal_lm

    model = functional_lm()
    target = np.random.default_rng(2).integers(3, 16, size=(2, 6)).astype("int32")
    _step_rows_apart(cached_causal_lm(model), keras.ops.convert_to_numpy(model(target)), target)
    # One token-and-position layer takes one position for every row: refused by name.
    ids = keras.Input((None,), dtype="int32")
    x = ka.TokenAndPositionEmbedding(50, 16, 16, mask_zero=True)(ids)
    x = ka.TransformerDecoder(num_heads=2, intermediate_dim=32)(x)
    combined = cached_causal_lm(keras.Model(ids, keras.layers.Dense(50)(x)))
    with pytest.raises(ValueError, match="one position for every row"):
        combined.call_with_cache(target[:, :1], combined.init_cache(2, 8), np.array([1, 2]))
