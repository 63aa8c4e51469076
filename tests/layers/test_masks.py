import keras
import numpy as np
import pytest
from keras import ops

from keras_attn.layers import masks
from tests.helpers import to_numpy


def test_causal_mask_is_lower_triangular():
    expected = np.tril(np.ones((4, 4), bool))[None]
    np.testing.assert_array_equal(to_numpy(masks.causal_mask(4)), expected)


def test_causal_mask_with_offset_matches_the_rows_of_the_full_mask():
    # Cached decoding: queries 3..4 of a 5-token sequence see exactly what they see in full.
    full = to_numpy(masks.causal_mask(5))[0]
    np.testing.assert_array_equal(to_numpy(masks.causal_mask(2, 5, offset=3))[0], full[3:])
    np.testing.assert_array_equal(to_numpy(masks.causal_mask(1, offset=4))[0], full[4:])


def test_causal_mask_rejects_negative_offset():
    with pytest.raises(ValueError, match="offset"):
        masks.causal_mask(2, offset=-1)


def test_padding_mask_to_attention_mask():
    pad = np.array([[1, 1, 0], [1, 0, 0]])
    out = to_numpy(masks.padding_mask_to_attention_mask(pad, query_length=2))
    assert out.shape == (2, 2, 3)
    np.testing.assert_array_equal(out[0], [[True, True, False]] * 2)
    np.testing.assert_array_equal(out[1], [[True, False, False]] * 2)
    with pytest.raises(ValueError, match="padding_mask"):
        masks.padding_mask_to_attention_mask(np.ones((2, 3, 3)))


def test_merge_masks_ands_every_source():
    q_pad = np.array([[True, True, False]])
    k_pad = np.array([[True, False, True]])
    explicit = np.array([[[True, True, True], [False, True, True], [True, True, True]]])
    merged = to_numpy(
        masks.merge_masks(
            q_pad, k_pad, explicit, use_causal_mask=True, query_length=3, key_length=3
        )
    )
    expected = q_pad[:, :, None] & k_pad[:, None, :] & explicit & np.tril(np.ones((3, 3), bool))
    np.testing.assert_array_equal(merged, expected)
    assert masks.merge_masks() is None


def test_merge_masks_rejects_bad_attention_mask_rank():
    with pytest.raises(ValueError, match="attention_mask"):
        masks.merge_masks(attention_mask=np.ones((1, 1, 2, 2), bool))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_mask_value_is_finite_and_safe_in_dtype(dtype):
    value = ops.convert_to_tensor(masks.mask_value(dtype), dtype=dtype)
    as_float = float(to_numpy(ops.cast(value, "float32")))
    assert np.isfinite(as_float) and as_float < -1e4
    # A real score minus the mask value must not overflow: softmax stays finite.
    scores = ops.cast(ops.convert_to_tensor([[3.0, -2.0, as_float]]), dtype)
    weights = to_numpy(ops.cast(ops.softmax(ops.cast(scores, "float32")), "float32"))
    assert np.isfinite(weights).all() and weights[0, 2] == 0.0


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_masked_softmax_fully_masked_row_gives_zeros_not_nan(dtype):
    scores = ops.cast(ops.convert_to_tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]), dtype)
    mask = np.array([[True, False, True], [False, False, False]])
    weights = to_numpy(ops.cast(masks.masked_softmax(scores, mask), "float32"))
    e = np.exp([1.0, 3.0])
    np.testing.assert_allclose(weights[0], [e[0] / e.sum(), 0.0, e[1] / e.sum()], rtol=1e-2)
    np.testing.assert_array_equal(weights[1], [0.0, 0.0, 0.0])
    assert keras.backend.standardize_dtype(masks.masked_softmax(scores, mask).dtype) == dtype


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (
            {"attention_mask": np.ones((2, 4, 5), bool)},
            "`attention_mask` must match the query length 5",
        ),
        (
            {"attention_mask": np.ones((2, 5, 7), bool)},
            "`attention_mask` must match the key length 5",
        ),
        ({"query_mask": np.ones((2, 6), bool)}, "`query_mask` must match the query length 5"),
    ],
)
def test_wrong_mask_shapes_are_value_errors_naming_the_mask(kwargs, words):
    """Issue 19: a mismatched mask surfaced as a broadcasting op error."""
    import keras_attn as ka

    x = np.random.default_rng(0).random((2, 5, 16)).astype("float32")
    with pytest.raises(ValueError, match=words):
        ka.MultiHeadAttention(num_heads=2, key_dim=8)(x, **kwargs)
    # Broadcastable masks are still fine: one query row for all, or the full shape.
    ka.MultiHeadAttention(num_heads=2, key_dim=8)(x, attention_mask=np.ones((2, 1, 5), bool))
