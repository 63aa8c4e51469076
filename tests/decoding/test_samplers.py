import numpy as np
import pytest

from keras_attn.decoding import Sampler, top_k_filter, top_p_filter
from keras_attn.decoding.samplers import log_softmax

LOGITS = np.log(np.array([[0.5, 0.2, 0.15, 0.1, 0.05]]))


def kept(filtered):
    return np.isfinite(filtered[0]).nonzero()[0].tolist()


def test_top_k_keeps_the_k_largest_and_ties():
    assert kept(top_k_filter(LOGITS, 2)) == [0, 1]
    assert kept(top_k_filter(LOGITS, 10)) == [0, 1, 2, 3, 4]
    tied = np.array([[1.0, 3.0, 2.0, 2.0]])
    assert kept(top_k_filter(tied, 2)) == [1, 2, 3]


def test_top_p_keeps_the_smallest_set_reaching_p():
    assert kept(top_p_filter(LOGITS, 0.5)) == [0]  # 0.5 alone reaches 0.5
    assert kept(top_p_filter(LOGITS, 0.6)) == [0, 1]  # 0.5 < 0.6 ≤ 0.7
    assert kept(top_p_filter(LOGITS, 0.85)) == [0, 1, 2]  # cumulative 0.85 reached
    assert kept(top_p_filter(LOGITS, 1.0)) == [0, 1, 2, 3, 4]
    shuffled = LOGITS[:, [3, 0, 4, 2, 1]]  # order of the vocabulary does not matter
    assert kept(top_p_filter(shuffled, 0.6)) == [1, 4]


def test_sampling_frequencies_follow_the_filtered_softmax():
    sampler = Sampler("sample", top_p=0.6, seed=0)
    draws = np.concatenate([sampler(np.repeat(LOGITS, 1000, 0)) for _ in range(10)])
    counts = np.bincount(draws, minlength=5) / len(draws)
    np.testing.assert_allclose(counts, [5 / 7, 2 / 7, 0, 0, 0], atol=0.015)
    hot = Sampler("sample", temperature=0.5, seed=1)  # p ∝ p_i^2
    draws = hot(np.repeat(LOGITS, 20000, 0))
    expected = np.array([0.5, 0.2, 0.15, 0.1, 0.05]) ** 2
    np.testing.assert_allclose(np.bincount(draws, minlength=5) / 20000,
                               expected / expected.sum(), atol=0.012)  # fmt: skip


def test_a_seed_gives_the_same_sample_twice():
    logits = np.random.default_rng(0).normal(size=(4, 50))
    a = [Sampler("sample", seed=7)(logits).tolist() for _ in range(2)]
    assert a[0] == a[1]
    b = Sampler("sample", seed=8)
    assert any(b(logits).tolist() != a[0] for _ in range(3))
    assert (Sampler("sample", top_k=1, seed=3)(logits) == logits.argmax(-1)).all()


def written_out(logits, temperature, top_k, top_p):
    """The filtered softmax's cumulative sums, as the sampler first computed them: one new
    array per operation, the overflow fallback always built."""
    logits = np.asarray(logits)
    with np.errstate(over="ignore"):
        scaled = logits / temperature
    overflow = (np.isinf(scaled) & np.isfinite(logits)).any(-1, keepdims=True)
    top = np.where(logits >= logits.max(-1, keepdims=True), 0.0, -np.inf)
    filtered = np.where(overflow, top, scaled)
    if top_k is not None:
        filtered = top_k_filter(filtered, top_k)
    if top_p is not None:
        filtered = top_p_filter(filtered, top_p)
    return np.cumsum(np.exp(log_softmax(filtered)), -1)


@pytest.mark.parametrize(
    "temperature, top_k, top_p, dtype",
    [(1.0, None, None, np.float64), (0.7, 40, None, np.float64), (1.3, None, 0.9, np.float64),
     (1e-308, None, None, np.float64), (1.0, None, None, np.float32),
     (0.9, 40, 0.95, np.float32)],
)  # fmt: skip
def test_a_draw_is_the_written_out_softmax_draw(temperature, top_k, top_p, dtype):
    """The sampler works in place; its ids are those of the plain formula, bit for bit,
    draw by draw, at a real vocabulary's width: with -inf logits, a temperature whose
    quotients overflow (1e-308), float32 logits (worked in float64), and the caller's
    logits left as they were."""
    rng = np.random.default_rng(5)
    logits = rng.normal(0, 4, size=(3, 49152)).astype(np.float32).astype(dtype)
    logits[1, ::3] = -np.inf
    before = logits.copy()
    sampler = Sampler("sample", temperature, top_k, top_p, seed=11)
    reference = np.random.default_rng(11)
    cumulative = written_out(logits, temperature, top_k, top_p)
    assert cumulative.dtype == np.float64
    if temperature < 1e-300:  # every row fell back to its top logit
        assert (cumulative[:, -1] == 1).all() and (cumulative[:, 0] < 1).all()
    for _ in range(20):
        draws = reference.random((3, 1))
        expected = np.minimum((cumulative < draws).sum(-1), 49151)
        assert sampler(logits).tolist() == expected.tolist()
    np.testing.assert_array_equal(logits, before)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"method": "beam_me_up"}, "sampler"),
        ({"temperature": 0.0}, "temperature"),
        ({"top_k": 0}, "top_k"),
        ({"top_p": 1.5}, "top_p"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Sampler(**{"method": "sample", **kwargs})
