import numpy as np
import pytest

from keras_attn.decoding import CausalLMRunner
from keras_attn.models import build_causal_lm, greedy_generate
from tests.conftest import keras_greedy
from tests.helpers import to_numpy


@pytest.fixture(scope="module")
def lm():
    import keras

    keras.utils.set_random_seed(3)
    return build_causal_lm(50, 32, hidden_dim=16, num_layers=2, num_heads=2)


def test_cached_logits_equal_full_recomputation_at_every_step(lm):
    ids = np.random.default_rng(0).integers(1, 50, size=(2, 9)).astype("int32")
    full = lm.predict(ids, verbose=0)
    runner = CausalLMRunner(lm)
    state = runner.initial_state([0, 1], 9)
    logits, state = runner.step(ids[:, :4], state, 0)  # prefill
    steps = [to_numpy(logits)]
    for t in range(4, 9):
        logits, state = runner.step(ids[:, t : t + 1], state, t)
        steps.append(to_numpy(logits))
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=1e-4)


def test_cached_greedy_equals_uncached_and_the_reference(lm):
    prompts = [[5, 6, 7], [9, 3, 12, 4, 8], [2]]  # three lengths in one batch
    cached = greedy_generate(lm, prompts, 6)
    assert cached == greedy_generate(lm, prompts, 6, use_cache=False)
    assert cached == [keras_greedy(lm, p, 6) for p in prompts]
    assert cached == lm.generate(prompts, 6)
    assert all(len(c) == 6 and 0 not in c for c in cached)


def test_errors(lm):
    with pytest.raises(ValueError, match="prompts"):
        greedy_generate(lm, [[]], 3)
    with pytest.raises(ValueError, match="max_new_tokens"):
        lm.generate([[1]], 0)
    with pytest.raises(ValueError, match="sampler"):
        lm.generate([[1]], 2, sampler="nucleus")
    with pytest.raises(ValueError, match="num_beams"):
        lm.generate([[1]], 2, sampler="beam", num_beams=0)
