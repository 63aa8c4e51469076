import math

import keras
import numpy as np
import pytest

import keras_attn as ka
from tests.helpers import to_numpy

A, B = [1.0, 0.0], [0.0, 1.0]


def test_ab_example_unscaled_dot():
    # Keys = values = A A B A; query [0, 1] scores s = [0, 0, 1, 0].
    seq = np.array([[A, A, B, A]], "float32")
    out, w = ka.Attention(score="dot")(
        np.array([[[0.0, 1.0]]], "float32"), seq, return_attention_scores=True
    )
    e = math.e
    expected_w = np.array([1, 1, e, 1]) / (3 + e)
    np.testing.assert_allclose(to_numpy(w)[0, 0], expected_w, rtol=1e-6)
    np.testing.assert_allclose(to_numpy(out)[0, 0], expected_w @ seq[0], rtol=1e-6)
    np.testing.assert_allclose(to_numpy(out)[0, 0], [3 / (3 + e), e / (3 + e)], rtol=1e-6)


def test_ab_example_sharp_query_selects_b():
    seq = np.array([[A, A, B, A]], "float32")
    out, w = ka.Attention(score="dot")(
        np.array([[[0.0, 10.0]]], "float32"), seq, return_attention_scores=True
    )
    np.testing.assert_allclose(to_numpy(w)[0, 0], [0, 0, 1, 0], atol=2e-4)
    np.testing.assert_allclose(to_numpy(out)[0, 0], B, atol=2e-4)


def test_projections_match_numpy():
    rng = np.random.default_rng(0)
    q, v = (
        rng.normal(size=(2, 3, 5)).astype("float32"),
        rng.normal(size=(2, 4, 6)).astype("float32"),
    )
    layer = ka.Attention(key_dim=8, value_dim=7)
    out = to_numpy(layer(q, v))
    wq, bq = to_numpy(layer.query_dense.kernel), to_numpy(layer.query_dense.bias)
    wk, bk = to_numpy(layer.key_dense.kernel), to_numpy(layer.key_dense.bias)
    wv, bv = to_numpy(layer.value_dense.kernel), to_numpy(layer.value_dense.bias)
    scores = (q @ wq + bq) @ np.swapaxes(v @ wk + bk, 1, 2) / math.sqrt(8)
    e = np.exp(scores - scores.max(-1, keepdims=True))
    np.testing.assert_allclose(out, (e / e.sum(-1, keepdims=True)) @ (v @ wv + bv), atol=1e-5)


def test_decoder_state_attends_over_lstm_states():
    # The RNN encoder-decoder use: one state (batch, 1, units) over encoder states.
    keras.utils.set_random_seed(0)
    src = keras.Input((None,), dtype="int32")
    states = keras.layers.LSTM(8, return_sequences=True)(
        keras.layers.Embedding(20, 8, mask_zero=True)(src)
    )
    dec_state = keras.Input((1, 8))
    context = ka.Attention(score="additive")(dec_state, states)
    model = keras.Model([src, dec_state], context)
    ids = np.array([[3, 4, 0, 0], [5, 6, 7, 8]])
    s = np.random.default_rng(1).normal(size=(2, 1, 8)).astype("float32")
    out = model.predict([ids, s], verbose=0)
    # Padding (from mask_zero) is respected: same output as the unpadded sequence alone.
    alone = model.predict([ids[:1, :2], s[:1]], verbose=0)
    np.testing.assert_allclose(out[:1], alone, atol=1e-6)


def test_propagated_mask_equals_explicit_attention_mask():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(2, 4, 6)).astype("float32")
    pad = np.array([[True, True, True, False], [True, True, False, False]])
    layer = ka.Attention(score="bilinear")
    auto = to_numpy(layer(x, query_mask=pad, value_mask=pad))
    explicit = to_numpy(layer(x, attention_mask=pad[:, :, None] & pad[:, None, :]))
    np.testing.assert_allclose(auto, explicit, atol=1e-6)
    assert np.all(auto[~pad] == 0.0)  # padded queries attend to nothing -> zeros


def test_causal_attention_ignores_the_future():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(1, 6, 4)).astype("float32")
    y = x.copy()
    y[:, 4:] = rng.normal(size=(1, 2, 4))
    layer = ka.Attention(key_dim=4)
    a = to_numpy(layer(x, use_causal_mask=True))
    b = to_numpy(layer(y, use_causal_mask=True))
    np.testing.assert_allclose(a[:, :4], b[:, :4], atol=1e-6)
    assert not np.allclose(a[:, 4:], b[:, 4:])


def test_dropout_only_in_training():
    x = np.ones((1, 8, 4), "float32") * np.arange(8, dtype="float32")[None, :, None]
    layer = ka.Attention(dropout=0.5)
    np.testing.assert_array_equal(to_numpy(layer(x)), to_numpy(layer(x, training=False)))
    assert not np.allclose(to_numpy(layer(x, training=True)), to_numpy(layer(x)))


@pytest.mark.parametrize(
    ("kwargs", "arg"),
    [({"key_dim": 0}, "key_dim"), ({"value_dim": -2}, "value_dim"), ({"dropout": 1.0}, "dropout")],
)
def test_bad_arguments(kwargs, arg):
    with pytest.raises(ValueError, match=arg):
        ka.Attention(**kwargs)


def test_bad_shapes():
    with pytest.raises(ValueError, match="query"):
        ka.Attention()(np.ones((2, 3), "float32"))
    with pytest.raises(ValueError, match="attention_mask"):
        ka.Attention()(np.ones((1, 2, 3), "float32"), attention_mask=np.ones((1, 1, 2, 2), bool))
