"""Attention masks: causal, padding, and their merge.

Convention (as in Keras): a boolean mask where `True` means "may attend". Attention masks have
shape `(batch, q_len, k_len)` or anything that broadcasts to it; padding masks have shape
`(batch, seq_len)` with `True` marking real tokens.
"""

import keras
import numpy as np
from keras import ops

from keras_attn.types import DType, Tensor


def per_row(index: object) -> bool:
    """Whether a position (`offset`, `start_index`, `cache_update_index`) is one per row of the
    batch, a `(batch,)` tensor, rather than one int or scalar shared by every row (cached
    decoding of rows at different lengths: iteration-level batching)."""
    shape = getattr(index, "shape", ())
    if getattr(shape, "rank", 0) is None:  # a graph tensor of unknown rank
        raise ValueError(
            "A position must be a scalar or one per row, of known rank. Received: a tensor of "
            "unknown rank"
        )
    return not isinstance(index, int) and len(shape) == 1


def row_positions(length: int | Tensor, start: int | Tensor) -> Tensor:
    """Int32 positions `start + 0 … start + length - 1`: `(length,)`, or `(batch, length)`
    when `start` is one per row."""
    steps = ops.arange(length, dtype="int32")
    if per_row(start):
        return ops.expand_dims(ops.cast(start, "int32"), 1) + ops.expand_dims(steps, 0)
    return steps + ops.cast(start, "int32")


def causal_mask(
    query_length: int | Tensor, key_length: int | Tensor | None = None, offset: int | Tensor = 0
) -> Tensor:
    """Lower-triangular mask: query `i` may attend to keys `j <= i + offset`.

    `offset` is the absolute position of the first query. In cached decoding the queries are the
    `query_length` newest tokens of a sequence whose first `offset` tokens are already in the cache,
    so `key_length = offset + query_length` and the last query sees every key.

    Args:
        query_length: int or scalar tensor. Number of queries, `T`.
        key_length: int or scalar tensor. Number of keys, `S`. Defaults to `query_length + offset`.
        offset: int, scalar tensor, or `(batch,)` tensor (one per row; `key_length` is then
            needed). Position of the first query. Defaults to `0`.
    Returns:
        bool tensor `(1, T, S)`, or `(batch, T, S)` with one offset per row.
    Example:
        >>> ops.convert_to_numpy(causal_mask(2, 3, offset=1)[0]).tolist()
        [[True, True, False], [True, True, True]]
    """
    if isinstance(offset, int) and offset < 0:
        raise ValueError(f"`offset` must be >= 0. Received: offset={offset}")
    if per_row(offset):
        if key_length is None:
            raise ValueError("`key_length` is needed with one `offset` per row.")
        rows = ops.expand_dims(row_positions(query_length, offset), -1)  # (B, T, 1)
        return ops.greater_equal(rows, ops.arange(key_length, dtype="int32"))
    if key_length is None:
        key_length = ops.add(query_length, offset)
    rows = ops.expand_dims(ops.add(ops.arange(query_length, dtype="int32"), offset), -1)
    cols = ops.expand_dims(ops.arange(key_length, dtype="int32"), 0)
    return ops.expand_dims(ops.greater_equal(rows, cols), 0)


def padding_mask_to_attention_mask(padding_mask: Tensor, query_length: int | None = None) -> Tensor:
    """Turns a key padding mask `(B, S)` into an attention mask `(B, 1, S)` or `(B, T, S)`.

    Args:
        padding_mask: bool or int tensor `(batch, seq_len)`; `True`/nonzero = real token.
        query_length: optional int. When given, the mask is broadcast to `(B, query_length, S)`.
    Returns:
        bool tensor `(B, 1, S)`, or `(B, query_length, S)`.
    """
    padding_mask = _as_bool(padding_mask, "padding_mask")
    if len(padding_mask.shape) != 2:
        raise ValueError(
            "`padding_mask` must have shape (batch, seq_len). "
            f"Received: padding_mask.shape={padding_mask.shape}"
        )
    mask = ops.expand_dims(padding_mask, 1)
    if query_length is not None:
        shape = ops.shape(mask)
        mask = ops.broadcast_to(mask, (shape[0], query_length, shape[2]))
    return mask


def merge_masks(
    query_mask: Tensor | None = None,
    key_mask: Tensor | None = None,
    attention_mask: Tensor | None = None,
    use_causal_mask: bool = False,
    query_length: int | Tensor | None = None,
    key_length: int | Tensor | None = None,
    causal_offset: int | Tensor = 0,
) -> Tensor | None:
    """Merges every mask source into one `(B|1, T|1, S)` bool attention mask, or `None`.

    The query's padding mask blocks whole rows (a padded query attends to nothing, and its output
    becomes zeros); the key's padding mask blocks columns; `attention_mask` is ANDed as given;
    `use_causal_mask` adds `causal_mask(query_length, key_length, causal_offset)`.

    Args:
        query_mask: optional `(B, T)` padding mask of the queries.
        key_mask: optional `(B, S)` padding mask of the keys/values.
        attention_mask: optional mask broadcastable to `(B, T, S)`.
        use_causal_mask: bool. Add a causal mask.
        query_length, key_length: int or scalar tensors; needed only with `use_causal_mask`.
        causal_offset: position of the first query, for cached decoding.
    Returns:
        bool tensor broadcastable to `(B, T, S)`, or `None` when there is nothing to mask.
    """
    merged = None

    def _and(a, b):
        return b if a is None else ops.logical_and(a, b)

    def _fits(name, mask, axis, length, what):
        """A mask axis known now must be 1 or the length it masks (else a clear error, not a
        broadcasting op failure later)."""
        size = mask.shape[axis]
        if isinstance(size, int) and isinstance(length, int) and size not in (1, length):
            raise ValueError(
                f"`{name}` must match the {what} length {length}. Received: "
                f"{name}.shape={tuple(mask.shape)}"
            )

    if query_mask is not None:
        _fits("query_mask", query_mask, -1, query_length, "query")
        merged = _and(merged, ops.expand_dims(_as_bool(query_mask, "query_mask"), -1))
    if key_mask is not None:
        _fits("key_mask", key_mask, -1, key_length, "key")
        merged = _and(merged, ops.expand_dims(_as_bool(key_mask, "key_mask"), -2))
    if attention_mask is not None:
        attention_mask = _as_bool(attention_mask, "attention_mask")
        if len(attention_mask.shape) == 2:
            attention_mask = ops.expand_dims(attention_mask, 0)
        if len(attention_mask.shape) != 3:
            raise ValueError(
                "`attention_mask` must have shape (batch, q_len, k_len) or (q_len, k_len). "
                f"Received: attention_mask.shape={attention_mask.shape}"
            )
        _fits("attention_mask", attention_mask, -2, query_length, "query")
        _fits("attention_mask", attention_mask, -1, key_length, "key")
        merged = _and(merged, attention_mask)
    if use_causal_mask:
        if query_length is None:
            raise ValueError("`query_length` is required when `use_causal_mask=True`.")
        merged = _and(merged, causal_mask(query_length, key_length, offset=causal_offset))
    return merged


def mask_value(dtype: DType) -> float:
    """The value masked scores get: large and negative, finite in `dtype` (float16 included).

    `0.7 * min(dtype)`, as Keras does: far below any real score, yet its difference with a real
    score does not overflow to `-inf`, so softmax never produces NaN.
    """
    dtype = keras.backend.standardize_dtype(dtype)
    if dtype == "bfloat16":
        return -0.7 * 3.3895313892515355e38
    return -0.7 * float(np.finfo(dtype).max)


def masked_softmax(scores: Tensor, mask: Tensor | None = None) -> Tensor:
    """Softmax over the last axis, computed in float32, with masked positions set to exactly zero.

    A row whose mask is all `False` yields all zeros (not NaN, not uniform weights).

    Args:
        scores: float tensor `(..., T, S)`.
        mask: optional bool tensor broadcastable to `scores`; `True` = may attend.
    Returns:
        float tensor of `scores`' dtype.
    """
    dtype = scores.dtype
    # Softmax in float32: in float16 exp() of a row of large scores overflows and sums lose bits.
    scores = ops.cast(scores, "float32")
    if mask is None:
        return ops.cast(ops.softmax(scores, axis=-1), dtype)
    scores = ops.where(mask, scores, mask_value("float32"))
    weights = ops.softmax(scores, axis=-1)
    weights = ops.where(mask, weights, 0.0)
    return ops.cast(weights, dtype)


def _as_bool(mask, name):
    if not hasattr(mask, "dtype"):
        mask = ops.convert_to_tensor(mask)
    if keras.backend.standardize_dtype(mask.dtype) == "bool":
        return mask
    return ops.cast(mask, "bool")
