"""Cached (incremental) decoding equals full recomputation."""

import numpy as np
import pytest

import keras_attn as ka
from tests.helpers import to_numpy

RNG = np.random.default_rng(0)
X = RNG.normal(size=(2, 7, 16)).astype("float32")


def incremental(layer, x, cache, prefill, **kwargs):
    """Prefill `prefill` tokens, then one token per call; returns outputs (B, T, d), cache."""
    out, cache = layer(x[:, :prefill], cache=cache, cache_update_index=0, **kwargs)
    outs = [to_numpy(out)]
    for t in range(prefill, x.shape[1]):
        out, cache = layer(x[:, t : t + 1], cache=cache, cache_update_index=t, **kwargs)
        outs.append(to_numpy(out))
    return np.concatenate(outs, axis=1), cache


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
@pytest.mark.parametrize("score", ["scaled_dot", "bilinear"])
def test_cached_multi_head_attention_equals_full(kv_heads, score):
    mha = ka.MultiHeadAttention(4, 8, num_key_value_heads=kv_heads, score=score)
    full = to_numpy(mha(X, use_causal_mask=True))
    cache = np.zeros((2, 2, 7, kv_heads, 8), "float32")
    cached, cache = incremental(mha, X, cache, prefill=3)
    np.testing.assert_allclose(cached, full, atol=1e-5)
    # The cache holds every token's keys: equal to projecting the whole sequence at once.
    np.testing.assert_allclose(to_numpy(cache)[:, 0], to_numpy(mha.key_dense(X)), atol=1e-6)


@pytest.mark.parametrize("normalize_first", [False, True])
def test_cached_decoder_block_equals_full(normalize_first):
    block = ka.TransformerDecoder(4, 32, normalize_first=normalize_first)
    full = to_numpy(block(X))
    cache = np.zeros((2, 2, 7, 4, 4), "float32")
    out, cache = block(X[:, :2], self_attention_cache=cache, self_attention_cache_update_index=0)
    outs = [to_numpy(out)]
    for t in range(2, 7):
        out, cache = block(
            X[:, t : t + 1], self_attention_cache=cache, self_attention_cache_update_index=t
        )
        outs.append(to_numpy(out))
    np.testing.assert_allclose(np.concatenate(outs, axis=1), full, atol=1e-5)


def test_cached_decoding_respects_key_padding():
    mha = ka.MultiHeadAttention(2, 8)
    pad = np.ones((2, 7), bool)
    pad[0, 1] = False  # a padded position inside the cached prefix
    full = to_numpy(mha(X, use_causal_mask=True, value_mask=pad))
    cache = np.zeros((2, 2, 7, 2, 8), "float32")
    cached, _ = incremental(mha, X, cache, prefill=3, value_mask=pad)
    np.testing.assert_allclose(cached[:, 2:], full[:, 2:], atol=1e-5)


def test_cache_errors():
    mha = ka.MultiHeadAttention(2, 8)
    mha(X)
    with pytest.raises(ValueError, match="cache"):
        mha(X[:, :1], cache=np.zeros((2, 7, 2, 8), "float32"), cache_update_index=0)
    with pytest.raises(ValueError, match="value_dim"):
        ka.MultiHeadAttention(2, 8, value_dim=4)(
            X[:, :1], cache=np.zeros((2, 2, 7, 2, 8), "float32"), cache_update_index=0
        )


def test_cross_attention_cache_equals_projecting_the_encoder_sequence():
    mha = ka.MultiHeadAttention(4, 8, num_key_value_heads=2)
    encoded = RNG.normal(size=(2, 5, 16)).astype("float32")
    pad = np.array([[True] * 5, [True, True, True, False, False]])
    full = to_numpy(mha(X, encoded, value_mask=pad))
    cache = mha.key_value_cache(encoded)
    assert tuple(cache.shape) == (2, 2, 5, 2, 8)
    for t in range(X.shape[1]):  # one query at a time, the cache never changes
        out, same = mha(X[:, t : t + 1], cache=cache, value_mask=pad)
        np.testing.assert_allclose(to_numpy(out), full[:, t : t + 1], atol=1e-5)
        assert same is cache
    # The masked encoder positions really are excluded: changing them changes nothing.
    moved = encoded.copy()
    moved[1, 3:] += 10.0
    out, _ = mha(X, cache=mha.key_value_cache(moved), value_mask=pad)
    np.testing.assert_allclose(to_numpy(out)[1], full[1], atol=1e-5)


def test_decoder_block_with_both_caches_equals_full():
    block = ka.TransformerDecoder(4, 32)
    encoded = RNG.normal(size=(2, 5, 16)).astype("float32")
    pad = np.array([[True] * 5, [True, True, False, False, False]])
    full = to_numpy(block(X, encoded, encoder_padding_mask=pad))
    cross = block.cross_attention.key_value_cache(encoded)
    cache = np.zeros((2, 2, 7, 4, 4), "float32")
    outs = []
    for t in range(7):
        out, cache = block(
            X[:, t : t + 1], encoder_padding_mask=pad, self_attention_cache=cache,
            self_attention_cache_update_index=t, cross_attention_cache=cross,
        )  # fmt: skip
        outs.append(to_numpy(out))
    np.testing.assert_allclose(np.concatenate(outs, axis=1), full, atol=1e-5)


def test_scatter_cache_writes_equal_slice_writes():
    from keras_attn.layers.tracing import onnx_tracing, write_cache

    cache = RNG.normal(size=(2, 7, 2, 8)).astype("float32")
    new = RNG.normal(size=(2, 3, 2, 8)).astype("float32")
    expected = cache.copy()
    expected[:, 2:5] = new
    np.testing.assert_array_equal(to_numpy(write_cache(cache, 2, new)), expected)
    with onnx_tracing():
        np.testing.assert_array_equal(to_numpy(write_cache(cache, 2, new)), expected)
        mha = ka.MultiHeadAttention(4, 8)
        full = to_numpy(mha(X, use_causal_mask=True))
        cached, _ = incremental(mha, X, np.zeros((2, 2, 7, 4, 8), "float32"), prefill=3)
    np.testing.assert_allclose(cached, full, atol=1e-5)
    np.testing.assert_array_equal(to_numpy(write_cache(cache, 0, new))[:, 3:], cache[:, 3:])
