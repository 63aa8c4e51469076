import math

import numpy as np
import pytest
from keras import ops

import keras_attn as ka
from tests.helpers import to_numpy


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_lecture_example_scaled_dot_weights():
    # One query whose dot products with four keys are 112, 96, 16, 8, with d_k = 64: scaling by
    # √64 = 8 gives 14, 12, 2, 1 and softmax weights ≈ 0.87, 0.12, 0.00, 0.00.
    d = 64
    keys = np.zeros((4, d), "float32")
    keys[np.arange(4), np.arange(4)] = 1.0
    query = np.zeros((1, d), "float32")
    query[0, :4] = [112, 96, 16, 8]
    scores = to_numpy(ka.ScaledDotScore()(query[None], keys[None]))[0, 0]
    np.testing.assert_allclose(scores, [14, 12, 2, 1], rtol=1e-6)
    weights = to_numpy(ka.masked_softmax(ops.convert_to_tensor(scores)))
    exact = np.exp([14, 12, 2, 1]) / np.exp([14, 12, 2, 1]).sum()
    np.testing.assert_allclose(weights, exact, rtol=1e-6)
    np.testing.assert_allclose(weights, [0.8808, 0.1192, 5.41e-6, 1.99e-6], rtol=1e-3)
    np.testing.assert_allclose(weights, [0.87, 0.12, 0.01, 0.00], atol=0.011)  # the lecture's
    # The attention layer gives the same weights.
    _, w = ka.Attention(score="scaled_dot")(query[None], keys[None], return_attention_scores=True)
    np.testing.assert_allclose(to_numpy(w)[0, 0], exact, rtol=1e-6)


def test_dot_score_is_unscaled_and_scaled_dot_accepts_a_scale():
    q, k = np.array([[[1.0, 2.0]]], "float32"), np.array([[[3.0, 4.0], [1.0, 0.0]]], "float32")
    np.testing.assert_allclose(to_numpy(ka.DotScore()(q, k)), [[[11.0, 1.0]]])
    np.testing.assert_allclose(
        to_numpy(ka.ScaledDotScore()(q, k)), [[[11 / math.sqrt(2), 1 / math.sqrt(2)]]], rtol=1e-6
    )
    np.testing.assert_allclose(to_numpy(ka.ScaledDotScore(scale=0.5)(q, k)), [[[5.5, 0.5]]])


def test_bilinear_score_matches_numpy():
    rng = np.random.default_rng(3)
    q, k = (
        rng.normal(size=(2, 3, 4)).astype("float32"),
        rng.normal(size=(2, 5, 6)).astype("float32"),
    )
    score = ka.BilinearScore()
    out = to_numpy(score(q, k))
    (w,) = [to_numpy(v) for v in score.weights]
    np.testing.assert_allclose(out, np.einsum("btq,qk,bsk->bts", q, w, k), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("use_bias", [True, False])
def test_additive_score_matches_numpy(use_bias):
    rng = np.random.default_rng(4)
    q, k = (
        rng.normal(size=(2, 3, 4)).astype("float32"),
        rng.normal(size=(2, 5, 6)).astype("float32"),
    )
    score = ka.AdditiveScore(units=7, use_bias=use_bias, kernel_initializer="he_normal")
    score(q, k)
    if use_bias:
        score.bias.assign(rng.normal(size=(7,)).astype("float32"))
    out = to_numpy(score(q, k))
    wq, wk, v = (to_numpy(x) for x in (score.query_kernel, score.key_kernel, score.score_kernel))
    b = to_numpy(score.bias) if use_bias else 0.0
    hidden = np.tanh((q @ wq)[:, :, None, :] + (k @ wk)[:, None, :, :] + b)
    np.testing.assert_allclose(out, hidden @ v, rtol=1e-5, atol=1e-5)


def test_score_works_on_per_head_tensors():
    rng = np.random.default_rng(5)
    q, k = rng.normal(size=(2, 4, 3, 8)), rng.normal(size=(2, 4, 6, 8))
    out = to_numpy(ka.DotScore()(q.astype("float32"), k.astype("float32")))
    np.testing.assert_allclose(out, np.einsum("bhtd,bhsd->bhts", q, k), rtol=1e-5, atol=1e-5)


def test_get_score_by_name_instance_and_config():
    assert isinstance(ka.get_score("additive"), ka.AdditiveScore)
    custom = ka.BilinearScore()
    assert ka.get_score(custom) is custom
    import keras

    restored = ka.get_score(keras.saving.serialize_keras_object(ka.ScaledDotScore(scale=0.25)))
    assert isinstance(restored, ka.ScaledDotScore) and restored.scale == 0.25


@pytest.mark.parametrize("bad", ["cosine", 3, None])
def test_unknown_score_is_a_value_error_naming_score(bad):
    with pytest.raises(ValueError, match="score"):
        ka.get_score(bad)
    with pytest.raises(ValueError, match="score"):
        ka.MultiHeadAttention(2, 4, score=bad)


def test_dot_scores_need_equal_depths():
    with pytest.raises(ValueError, match="same depth"):
        ka.DotScore()(np.ones((1, 2, 3), "float32"), np.ones((1, 2, 4), "float32"))


def test_score_argument_errors():
    with pytest.raises(ValueError, match="scale"):
        ka.ScaledDotScore(scale=0)
    with pytest.raises(ValueError, match="units"):
        ka.AdditiveScore(units=0)


def test_custom_score_plugs_into_attention():
    class NegativeDistance(ka.Score):
        def call(self, query, key):
            diff = ops.expand_dims(query, -2) - ops.expand_dims(key, -3)
            return -ops.sum(diff * diff, axis=-1)

    q = np.array([[[0.0, 0.0]]], "float32")
    k = np.array([[[0.0, 0.0], [3.0, 0.0]]], "float32")
    _, w = ka.Attention(score=NegativeDistance())(q, k, return_attention_scores=True)
    np.testing.assert_allclose(to_numpy(w)[0, 0], softmax(np.array([0.0, -9.0])), rtol=1e-6)
