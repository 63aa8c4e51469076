"""Which kernel computes softmax(q·kᵀ)·v on projected heads whose queries are already scaled:
`ops.dot_product_attention` (a fused kernel where the backend has one), the three-op
`attend_heads_last` on TensorFlow (no fused kernel there), or `attend_per_head`, one loop per
head, for long sequences on a TensorFlow CPU (measured there: `bench/attention.py`)."""

import keras
from keras import ops

from keras_attn.layers.attention import attend_heads_last, attend_per_head
from keras_attn.layers.tracing import on_tensorflow, on_tensorflow_cpu
from keras_attn.types import Tensor

# Smallest T·S where `attend_per_head` runs instead of one batched pass (see `bench/attention.py`).
PER_HEAD_MIN_SCORES = 1024 * 1024


def per_head_is_faster(query: Tensor, key: Tensor) -> bool:
    """Whether `attend_per_head` beats one batched pass: TensorFlow on a CPU (no fused
    attention kernel there) with static lengths and T·S >= 1024², where it measured ~1.5x
    faster; below that the loop's overhead dominates. Never on a GPU, where it was not
    measured to win. (Grouped key/value heads are repeated to every query head before
    either path.)"""
    lengths = query.shape[1], key.shape[1]
    return bool(
        on_tensorflow_cpu(query)
        and None not in lengths
        and lengths[0] * lengths[1] >= PER_HEAD_MIN_SCORES
    )


def attend_scaled(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    only_causal: bool,
    per_head: bool,
    dropout: keras.layers.Dropout | None = None,
    training: bool | None = None,
) -> Tensor:
    """Attention of scaled queries `q` over `k`, `v`: `(B, H, T, d)` when `per_head`, else
    `(B, T, H, d)`. `mask` is the merged `(B|1, T, S)` boolean mask (or None); `only_causal`
    says it is the causal mask alone (a fused kernel builds it itself). Rows with no visible
    key are zeros on every path."""
    if per_head:
        return attend_per_head(q, k, v, mask)
    if on_tensorflow():
        # No fused kernel there: skip `dot_product_attention`'s pass scaling the scores.
        return attend_heads_last(q, k, v, mask, dropout=dropout, training=training)
    if only_causal:
        return ops.dot_product_attention(q, k, v, scale=1.0, is_causal=True)
    head_mask = None if mask is None else ops.expand_dims(mask, 1)
    out = ops.dot_product_attention(q, k, v, mask=head_mask, scale=1.0)
    if mask is not None:
        # Fused kernels average (or NaN) rows with no visible key; we promise zeros.
        visible = ops.any(mask, axis=-1)  # (B|1, T|1)
        visible = ops.expand_dims(ops.expand_dims(visible, -1), -1)
        out = ops.where(visible, out, ops.zeros_like(out))
    return out
