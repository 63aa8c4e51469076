"""Incremental decoding: attention of new tokens over a key/value cache, and the cache of a
fixed sequence (cross-attention) projected once. A part of `MultiHeadAttention`, kept here
so that the layer's file holds the attention itself."""

from typing import Any

from keras import ops

from keras_attn.layers.masks import row_positions
from keras_attn.layers.tracing import write_cache
from keras_attn.types import Tensor


class KeyValueCache:
    """`MultiHeadAttention`'s cached paths (a mixin: it uses the layer's projections, rotary
    positions and attention)."""

    key_dense: Any  # the layer's projections, built by `MultiHeadAttention.build`
    value_dense: Any

    def key_value_cache(self, value: Tensor, key: Tensor | None = None) -> Tensor:
        """Projected keys and values of a fixed sequence, `(batch, 2, S, kv_heads, key_dim)`.

        Computed once and passed as `cache` without `cache_update_index`, cross-attention of
        each decoding step skips projecting the encoder outputs again.
        """
        key = value if key is None else key
        return ops.stack([self.key_dense(key), self.value_dense(value)], axis=1)

    def _call_cached(
        self, query, query_mask, key_padding_mask, attention_mask, cache, cache_update_index,
        return_attention_scores, training, score_bias=None,
    ):  # fmt: skip
        """Causal self-attention of new tokens over a key/value cache (incremental decoding).

        `cache` is `(batch, 2, max_length, num_key_value_heads, key_dim)`: keys, then values.
        The new tokens' keys and values are written at `cache_update_index`, and the queries
        attend causally over the whole cache (positions after them are masked).
        """
        if (self.value_dim or self.key_dim) != self.key_dim:
            raise ValueError(
                "A cache stores keys and values together: it needs value_dim == key_dim. "
                f"Received: key_dim={self.key_dim}, value_dim={self.value_dim}"
            )
        expected = (self._kv_heads, self.key_dim)
        if len(cache.shape) != 5 or cache.shape[1] != 2 or tuple(cache.shape[3:]) != expected:
            raise ValueError(
                "`cache` must have shape (batch, 2, max_length, num_key_value_heads, key_dim) "
                f"= (batch, 2, max_length, {expected[0]}, {expected[1]}). "
                f"Received: cache.shape={tuple(cache.shape)}"
            )
        causal = cache_update_index is not None
        positions = row_positions(ops.shape(query)[1], cache_update_index if causal else 0)
        if causal:
            start = cache_update_index
            new_keys = self._rope(self.key_dense(query), positions, 1)
            keys = write_cache(cache[:, 0], start, ops.cast(new_keys, cache.dtype))
            values = write_cache(cache[:, 1], start, ops.cast(self.value_dense(query), cache.dtype))
            cache = ops.stack([keys, values], axis=1)
        else:  # cross-attention over keys and values projected once by `key_value_cache`
            keys, values = cache[:, 0], cache[:, 1]
        fused = self.score.is_scaled_dot and not return_attention_scores and score_bias is None
        q, k, v = (
            self._rope(self.query_dense(query), positions, 1),
            ops.cast(keys, query.dtype),
            ops.cast(values, query.dtype),
        )
        if not fused:
            q, k, v = (ops.transpose(t, (0, 2, 1, 3)) for t in (q, k, v))
        k, v = self._share_kv_heads(k, v, head_axis=2 if fused else 1)
        outputs = self._attend_projected(
            q, k, v, query_mask, key_padding_mask, None, attention_mask, causal,
            fused, False, return_attention_scores, training,
            causal_offset=cache_update_index if causal else 0, score_bias=score_bias,
        )  # fmt: skip
        if return_attention_scores:
            return (*outputs, cache)
        return outputs, cache
