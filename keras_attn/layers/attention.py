"""Single-head attention: scores, softmax, weighted sum of values.

`attend` is the computation every attention layer here shares; `Attention` wraps it as a layer
with optional W_q, W_k, W_v projections.
"""

from collections.abc import Callable
from typing import Any

import keras
from keras import ops

from keras_attn.layers.initializers import fresh
from keras_attn.layers.masks import mask_value, masked_softmax, merge_masks
from keras_attn.layers.scores import Score, get_score, serialize_score
from keras_attn.types import Initializer, Shape, Tensor


def attend(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    score: Score,
    mask: Tensor | None = None,
    dropout: keras.layers.Dropout | None = None,
    training: bool | None = None,
    bias: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """softmax(score(q, k) + bias) · v over the last two axes, with masking and optional dropout.

    Args:
        query: `(..., T, d_q)`. key: `(..., S, d_k)`. value: `(..., S, d_v)`.
        score: a `Score` layer.
        mask: optional bool, broadcastable to `(..., T, S)`; `True` = may attend.
        dropout: optional `keras.layers.Dropout` applied to the weights.
        bias: optional float, broadcastable to `(..., T, S)`: added to the scores before the
            mask and softmax (T5's relative position bias).
    Returns:
        `(output (..., T, d_v), weights (..., T, S))`. `weights` are before dropout.
    """
    scores = score(query, key)
    if bias is not None:  # in float32: T5's unscaled scores plus bias overflow float16
        dtype = scores.dtype
        scores = ops.cast(ops.cast(scores, "float32") + ops.cast(bias, "float32"), dtype)
    weights = masked_softmax(scores, mask)
    dropped = dropout(weights, training=training) if dropout is not None else weights
    return ops.matmul(dropped, value), weights


def attend_heads_last(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None = None,
    dropout: keras.layers.Dropout | None = None,
    training: bool | None = None,
) -> Tensor:
    """`softmax(q kᵀ) v` for `(B, T, H, d)` heads, as `keras.ops.dot_product_attention` lays
    them out, in three passes over the `(B, H, T, S)` scores: matmul, softmax, matmul.

    TensorFlow's `dot_product_attention` has no fused kernel; it adds a fourth pass (the scores
    times `scale`, also when the scale is 1.0) and its gradient. Callers scale the queries
    instead, which touches `(T, d)` rather than `(T, S)` elements.

    Args:
        query: `(B, T, H, d)`, already scaled. key: `(B, S, H, d)`. value: `(B, S, H, d_v)`.
        mask: optional bool `(B|1, T|1, S)`; `True` = may attend. Rows with no visible key
            give zeros.
        dropout: optional `keras.layers.Dropout` applied to the weights.
    Returns:
        `(B, T, H, d_v)`.
    """
    scores = ops.einsum("bthd,bshd->bhts", query, key)
    dtype = scores.dtype
    scores = ops.cast(scores, "float32")  # softmax in float32, as `masked_softmax`
    if mask is not None:
        scores = ops.where(ops.expand_dims(mask, 1), scores, mask_value("float32"))
    weights = ops.cast(ops.softmax(scores, axis=-1), dtype)
    if dropout is not None:
        weights = dropout(weights, training=training)
    out = ops.einsum("bhts,bshd->bthd", weights, value)
    if mask is None:
        return out
    visible = ops.any(mask, axis=-1)  # (B|1, T|1)
    return out * ops.cast(ops.expand_dims(ops.expand_dims(visible, -1), -1), out.dtype)


def attend_per_head(
    query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None
) -> Tensor:
    """`softmax(q kᵀ) v` for `(B, H, T, d)` heads, one `(batch, head)` pair at a time.

    The same numbers as `attend` with a plain dot score, computed under `keras.ops.map` so
    each `(T, S)` score matrix stays in the CPU cache between the matmul, the softmax and the
    second matmul. Where no backend kernel fuses attention (TensorFlow on any device), this is
    ~1.5x faster than one batched `(B, H, T, S)` pass at seq 2048 (`bench/attention.py`); at
    short sequences the loop costs more than it saves, so callers use it for long ones only.

    The gradient is written out, as flash attention does it: each pair's weights P are
    recomputed from q and k, then dV = Pᵀ dO, dS = P ∘ (dO Vᵀ − rowsum(dO ∘ O)), dQ = dS K,
    dK = dSᵀ Q, all while that pair's scores are in cache. Automatic differentiation of the
    loop would store every pair's P and read it back (~20% slower forward+backward).

    Args:
        query: `(B, H, T, d)`, already scaled. key: `(B, H, S, d)`. value: `(B, H, S, d_v)`.
        mask: optional bool `(B|1, T|1, S)`; `True` = may attend. Rows with no visible key
            give zeros.
    Returns:
        `(B, H, T, d_v)`.
    """
    shape = ops.shape(query)
    heads, length, d_v = shape[1], shape[2], ops.shape(value)[-1]
    flat = [ops.reshape(x, (-1, *ops.shape(x)[2:])) for x in (query, key, value)]
    index = ops.arange(ops.shape(flat[0])[0], dtype="int32")
    shared_mask = mask is not None and mask.shape[0] == 1

    def weights_and_visible(q: Tensor, k: Tensor, i: Tensor) -> tuple[Tensor, Tensor | None]:
        """One pair's softmax weights `(T, S)` and, under a mask, which rows see a key."""
        scores = ops.matmul(q, ops.transpose(k))
        if mask is None:
            return ops.softmax(scores, axis=-1), None
        row = ops.take(mask, 0 if shared_mask else i // heads, axis=0)  # (T|1, S)
        scores = ops.where(row, scores, mask_value(scores.dtype))
        visible = ops.cast(ops.any(row, axis=-1, keepdims=True), scores.dtype)
        return ops.softmax(scores, axis=-1), visible

    def one_head(args: tuple[Tensor, Tensor, Tensor, Tensor]) -> Tensor:
        q, k, v, i = args
        weights, visible = weights_and_visible(q, k, i)
        out = ops.matmul(weights, v)
        return out if visible is None else out * visible

    def one_head_gradient(args: tuple[Tensor, ...]) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v, out, d_out, i = args
        weights, visible = weights_and_visible(q, k, i)
        if visible is not None:
            d_out = d_out * visible  # rows that see nothing output 0 whatever their weights
        d_value = ops.matmul(ops.transpose(weights), d_out)
        d_weights = ops.matmul(d_out, ops.transpose(v))
        # rowsum(dP ∘ P) = rowsum(dO ∘ O): a (T, d_v) product instead of a (T, S) one.
        d_scores = weights * (d_weights - ops.sum(d_out * out, axis=-1, keepdims=True))
        return ops.matmul(d_scores, k), ops.matmul(ops.transpose(d_scores), q), d_value

    @ops.custom_gradient
    def core(
        q: Tensor, k: Tensor, v: Tensor
    ) -> tuple[Tensor, Callable[..., tuple[Tensor, Tensor, Tensor]]]:
        out = ops.map(one_head, (q, k, v, index))

        def gradient(
            *args: Tensor, upstream: Tensor | None = None
        ) -> tuple[Tensor, Tensor, Tensor]:
            d_out = args[0] if upstream is None else upstream
            return ops.map(one_head_gradient, (q, k, v, out, d_out, index))

        return out, gradient

    out = core(*flat)
    return ops.reshape(out, (-1, heads, length, d_v))


def resolve_input_masks(
    value: Tensor | None,
    key: Tensor | None,
    query_mask: Tensor | None,
    value_mask: Tensor | None,
    key_mask: Tensor | None,
    mask: Tensor | None,
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """Padding masks of an attention call, from explicit arguments or Keras mask propagation.

    Keras fills `mask` when a layer is called with a single tensor (self-attention) and
    `<arg>_mask` when called with several, so both routes end here. In self-attention the keys
    and values are the queries, and so are their masks.
    """
    if query_mask is None:
        query_mask = mask
    if value is None:
        value_mask = query_mask if value_mask is None else value_mask
    if key is None:
        key_mask = None  # the keys are the values: `value_mask` covers them.
    return query_mask, value_mask, key_mask


def combined_mask(
    query_mask: Tensor | None,
    value_mask: Tensor | None,
    key_mask: Tensor | None,
    attention_mask: Tensor | None,
    use_causal_mask: bool,
    q_len: int | Tensor,
    k_len: int | Tensor,
    offset: int | Tensor = 0,
) -> Tensor | None:
    """Every mask source merged into one bool `(B|1, T|1, S)` tensor, or `None`."""
    return merge_masks(
        query_mask=query_mask,
        key_mask=key_side_mask(value_mask, key_mask),
        attention_mask=attention_mask,
        use_causal_mask=use_causal_mask,
        query_length=q_len,
        key_length=k_len,
        causal_offset=offset,
    )


def key_side_mask(value_mask: Tensor | None, key_mask: Tensor | None) -> Tensor | None:
    """The padding masks of values and keys as one `(B, S)` mask (either may be `None`)."""
    if value_mask is None or key_mask is None:
        return key_mask if value_mask is None else value_mask
    return ops.logical_and(ops.cast(value_mask, "bool"), ops.cast(key_mask, "bool"))


def check_rank3(name: str, shape: Shape) -> None:
    if len(shape) != 3:
        raise ValueError(
            f"`{name}` must have shape (batch, seq_len, dim). Received: {name}.shape={tuple(shape)}"
        )


@keras.saving.register_keras_serializable(package="keras_attn")
class Attention(keras.layers.Layer):
    """One attention head: `softmax(score(q W_q, k W_k)) · (v W_v)`.

    Without projections (the default) queries attend over keys and values as given, which is
    the attention of RNN encoder-decoders (a decoder state attending over encoder states). With
    `key_dim`, queries and keys are first projected by W_q, W_k to `key_dim`; with `value_dim`,
    values are projected by W_v.

    Args:
        score: `"dot"`, `"scaled_dot"`, `"bilinear"`, `"additive"` or a `Score` instance.
            Defaults to `"scaled_dot"`.
        key_dim: optional int. Adds W_q and W_k projecting queries and keys to this size.
        value_dim: optional int. Adds W_v projecting values to this size.
        use_bias: bool. Biases in the projections. Defaults to `True`.
        dropout: float. Dropout on the attention weights during training. Defaults to `0.0`.
        kernel_initializer, bias_initializer: initializers of the projections.
    Call arguments:
        query: `(batch, T, d_q)`.
        value: optional `(batch, S, d_v)`; defaults to `query` (self-attention).
        key: optional `(batch, S, d_k)`; defaults to `value`.
        query_mask, value_mask, key_mask: optional `(batch, T|S)` padding masks; filled in by
            Keras mask propagation when not given.
        attention_mask: optional bool `(batch, T, S)`; `True` = may attend.
        use_causal_mask: bool. Query `i` attends only to keys `<= i`.
        return_attention_scores: bool. Also return the weights `(batch, T, S)`.
    Returns:
        `(batch, T, d_v or value_dim)`, and the weights when asked for.
    Example:
        >>> enc = keras.random.normal((2, 7, 16)); state = keras.random.normal((2, 1, 16))
        >>> tuple(Attention(score="additive")(state, enc).shape)
        (2, 1, 16)
    """

    def __init__(
        self,
        score: str | dict[str, Any] | Score = "scaled_dot",
        key_dim: int | None = None,
        value_dim: int | None = None,
        use_bias: bool = True,
        dropout: float = 0.0,
        kernel_initializer: Initializer = "glorot_uniform",
        bias_initializer: Initializer = "zeros",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        for arg, val in (("key_dim", key_dim), ("value_dim", value_dim)):
            if val is not None and (not isinstance(val, int) or val <= 0):
                raise ValueError(f"`{arg}` must be a positive integer. Received: {arg}={val}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"`dropout` must be in [0, 1). Received: dropout={dropout}")
        self._score_arg = score
        self.score = get_score(score, dtype=self.dtype_policy, name="score")
        self.key_dim = key_dim
        self.value_dim = value_dim
        self.use_bias = use_bias
        self.dropout = dropout
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.supports_masking = True

    def _dense(self, units, name):
        return keras.layers.Dense(
            units,
            use_bias=self.use_bias,
            kernel_initializer=fresh(self.kernel_initializer),
            bias_initializer=fresh(self.bias_initializer),
            dtype=self.dtype_policy,
            name=name,
        )

    def build(
        self, query_shape: Shape, value_shape: Shape | None = None, key_shape: Shape | None = None
    ) -> None:
        value_shape = query_shape if value_shape is None else value_shape
        key_shape = value_shape if key_shape is None else key_shape
        for name, shape in (("query", query_shape), ("value", value_shape), ("key", key_shape)):
            check_rank3(name, shape)
        self.query_dense = self.key_dense = self.value_dense = None
        if self.key_dim is not None:
            self.query_dense = self._dense(self.key_dim, "query")
            self.query_dense.build(query_shape)
            self.key_dense = self._dense(self.key_dim, "key")
            self.key_dense.build(key_shape)
            query_shape = key_shape = (*key_shape[:-1], self.key_dim)
        if self.value_dim is not None:
            self.value_dense = self._dense(self.value_dim, "value")
            self.value_dense.build(value_shape)
        self.score.build(query_shape, key_shape)
        self.dropout_layer = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)

    def call(
        self,
        query: Tensor,
        value: Tensor | None = None,
        key: Tensor | None = None,
        query_mask: Tensor | None = None,
        value_mask: Tensor | None = None,
        key_mask: Tensor | None = None,
        attention_mask: Tensor | None = None,
        use_causal_mask: bool = False,
        return_attention_scores: bool = False,
        training: bool | None = None,
        mask: Tensor | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        query_mask, value_mask, key_mask = resolve_input_masks(
            value, key, query_mask, value_mask, key_mask, mask
        )
        value = query if value is None else value
        key = value if key is None else key
        merged = combined_mask(
            query_mask,
            value_mask,
            key_mask,
            attention_mask,
            use_causal_mask,
            ops.shape(query)[1],
            ops.shape(key)[1],
        )
        q = self.query_dense(query) if self.query_dense is not None else query
        k = self.key_dense(key) if self.key_dense is not None else key
        v = self.value_dense(value) if self.value_dense is not None else value
        output, weights = attend(
            q,
            k,
            v,
            self.score,
            mask=merged,
            dropout=self.dropout_layer if self.dropout > 0 else None,
            training=training,
        )
        if return_attention_scores:
            return output, weights
        return output

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "score": serialize_score(self._score_arg, self.score),
            "key_dim": self.key_dim,
            "value_dim": self.value_dim,
            "use_bias": self.use_bias,
            "dropout": self.dropout,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            "bias_initializer": keras.initializers.serialize(self.bias_initializer),
        }
