"""Multi-head attention: per-head W_q, W_k, W_v, attention per head, heads concatenated, W_O."""

from typing import Any

import keras
from keras import ops

from keras_attn.checks import check_positive_int
from keras_attn.layers.attention import (
    attend,
    check_rank3,
    combined_mask,
    key_side_mask,
    resolve_input_masks,
)
from keras_attn.layers.attention_cache import KeyValueCache
from keras_attn.layers.fused_attention import attend_scaled, per_head_is_faster
from keras_attn.layers.initializers import fresh
from keras_attn.layers.rotary_embedding import check_rope_scaling, inverse_frequencies, rotate
from keras_attn.layers.scores import Score, get_score, serialize_score
from keras_attn.layers.tracing import (  # noqa: F401  (onnx_tracing: imported from here too)
    attend_for_onnx,
    is_onnx_tracing,
    on_tensorflow,
    onnx_tracing,
)
from keras_attn.types import Initializer, Shape, Tensor


@keras.saving.register_keras_serializable(package="keras_attn")
class MultiHeadAttention(KeyValueCache, keras.layers.Layer):
    """Multi-head attention (Vaswani et al.), with grouped-query heads and pluggable scores.

    Each head projects queries, keys and values with its own W_q, W_k, W_v, attends, and the
    heads' outputs are concatenated and projected by W_O. All heads run in one batched einsum,
    never a Python loop. With `num_key_value_heads < num_heads` (grouped-query attention) groups
    of query heads share one key/value head.

    The default `"scaled_dot"` score runs through `keras.ops.dot_product_attention` whenever
    the weights are not needed (no `return_attention_scores`, and no dropout unless
    `training`) and `value_dim == key_dim`, so each backend's fused kernel applies; other
    scores use the explicit path. TensorFlow has no fused kernel, and its
    `dot_product_attention` spends a pass over the scores multiplying them by the scale: there
    the scaled queries go through `attend_heads_last` (also with dropout, and any value
    width), or `attend_per_head` for long sequences.
    Weights are laid out as in `keras.layers.MultiHeadAttention`, so they copy across one-to-one.

    Args:
        num_heads: int. Number of query heads.
        key_dim: int. Size of each head for queries and keys.
        value_dim: int. Size of each head for values. Defaults to `key_dim`.
        num_key_value_heads: int. Number of key/value heads; must divide `num_heads`. Defaults
            to `num_heads` (standard multi-head attention).
        dropout: float. Dropout on the attention weights during training. Defaults to `0.0`.
        use_bias: bool. Biases in the projections. Defaults to `True`.
        output_use_bias: bool. Bias in W_O; defaults to `use_bias` (Qwen2: biased q, k, v,
            unbiased W_O).
        rope_max_wavelength: float. Rotary position embedding of queries and keys after
            their projections (Llama's `rope_theta`), positions counted from 0 or from
            `cache_update_index`; defaults to `None` (no rotary: positions come from the
            embeddings).
        rope_scaling: optional dict: Hugging Face's `rope_scaling` (see `RotaryEmbedding`).
        output_dim: int. Size of the output. Defaults to the query's last dimension.
        score: `"scaled_dot"` (default), `"dot"`, `"bilinear"`, `"additive"`, or a `Score`.
        kernel_initializer, bias_initializer: initializers of the projections.
    Call arguments:
        query: `(batch, T, dim)`.
        value: optional `(batch, S, dim_v)`; defaults to `query` (self-attention).
        key: optional `(batch, S, dim_k)`; defaults to `value`.
        query_mask, value_mask, key_mask: optional padding masks, filled in by Keras mask
            propagation when not given (`mask` receives it in self-attention).
        attention_mask: optional bool `(batch, T, S)`; `True` = may attend.
        use_causal_mask: bool. Query `i` attends only to keys `<= i`.
        return_attention_scores: bool. Also return the weights `(batch, num_heads, T, S)`.
        cache: optional `(batch, 2, max_length, num_key_value_heads, key_dim)` keys and values
            of earlier tokens, for incremental (cached) causal self-attention; or, with no
            `cache_update_index`, the projected keys and values of a fixed sequence from
            `key_value_cache` (cross-attention), used as they are.
        cache_update_index: int or scalar tensor: position of the first new token in `cache`.
        position_ids: optional int `(batch, T)`: the rotary position of each token (left
            padding); defaults to `0 … T-1`.
        score_bias: optional float, broadcastable to `(batch, num_heads, T, S)` (with a
            cache, S is its `max_length`): added to the scores before masking and softmax
            (T5's relative position bias, from `RelativePositionBias`). Takes the explicit
            path rather than the fused kernel.
    Returns:
        `(batch, T, output_dim)`, and the weights when asked for. Padded queries give zeros.
        With a cache, the updated cache comes last.
    Example:
        >>> x = keras.random.normal((2, 8, 64))
        >>> tuple(MultiHeadAttention(num_heads=4, key_dim=16)(x).shape)
        (2, 8, 64)
    """

    def __init__(
        self,
        num_heads: int,
        key_dim: int,
        value_dim: int | None = None,
        num_key_value_heads: int | None = None,
        dropout: float = 0.0,
        use_bias: bool = True,
        output_dim: int | None = None,
        score: str | dict[str, Any] | Score = "scaled_dot",
        kernel_initializer: Initializer = "glorot_uniform",
        bias_initializer: Initializer = "zeros",
        output_use_bias: bool | None = None,
        rope_max_wavelength: float | None = None,
        rope_scaling: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        check_positive_int("num_heads", num_heads)
        if rope_max_wavelength is not None and not rope_max_wavelength > 1:
            raise ValueError(
                "`rope_max_wavelength` must be greater than 1 (or None). "
                f"Received: rope_max_wavelength={rope_max_wavelength}"
            )
        if rope_max_wavelength is not None and key_dim % 2:
            raise ValueError(
                f"Rotary positions need an even `key_dim`. Received: key_dim={key_dim}"
            )
        check_positive_int("key_dim", key_dim)
        check_positive_int("value_dim", value_dim, allow_none=True)
        check_positive_int("num_key_value_heads", num_key_value_heads, allow_none=True)
        check_positive_int("output_dim", output_dim, allow_none=True)
        if num_key_value_heads is not None and num_heads % num_key_value_heads:
            raise ValueError(
                "`num_key_value_heads` must divide `num_heads`. Received: "
                f"num_key_value_heads={num_key_value_heads}, num_heads={num_heads}"
            )
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"`dropout` must be in [0, 1). Received: dropout={dropout}")
        self.num_heads = num_heads
        self.key_dim = key_dim
        self.value_dim = value_dim
        self.num_key_value_heads = num_key_value_heads
        self.dropout = dropout
        self.use_bias = use_bias
        self.output_use_bias = output_use_bias
        self.rope_max_wavelength = rope_max_wavelength
        self.rope_scaling = check_rope_scaling(rope_scaling)
        self.output_dim = output_dim
        self._score_arg = score
        self.score = get_score(score, dtype=self.dtype_policy, name="score")
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.supports_masking = True

    @property
    def _kv_heads(self):
        return self.num_key_value_heads or self.num_heads

    @property
    def _output_bias(self):
        return self.use_bias if self.output_use_bias is None else self.output_use_bias

    def _einsum_dense(self, equation, output_shape, bias_axes, name, use_bias=None):
        use_bias = self.use_bias if use_bias is None else use_bias
        layer = keras.layers.EinsumDense(
            equation,
            output_shape=output_shape,
            bias_axes=bias_axes if use_bias else None,
            kernel_initializer=fresh(self.kernel_initializer),
            bias_initializer=fresh(self.bias_initializer),
            dtype=self.dtype_policy,
            name=name,
        )
        # Projections act per position, so a padding mask passes through them unchanged.
        layer.supports_masking = True
        return layer

    def _share_kv_heads(self, k, v, head_axis):
        """Grouped-query attention: each key/value head serves `num_heads // kv_heads` queries."""
        if self._kv_heads == self.num_heads:
            return k, v
        groups = self.num_heads // self._kv_heads
        return ops.repeat(k, groups, axis=head_axis), ops.repeat(v, groups, axis=head_axis)

    @property
    def _quantized(self):
        """Whether Keras quantized a projection (`model.quantize`): its `kernel` is then
        int8 or float8 plus scales, so only its own call computes it."""
        denses = (self.query_dense, self.key_dense, self.value_dense, self.output_dense)
        return any(dense.quantization_mode for dense in denses)

    @staticmethod
    def _project(dense, x, layout):
        """`dense(x)` laid out as `(B, T, H, d)` ("bthk") or `(B, H, T, d)` ("bhtk")."""
        if layout == "bthk":
            return dense(x)
        if dense.quantization_mode:
            return ops.transpose(dense(x), (0, 2, 1, 3))
        out = ops.einsum("btd,dhk->bhtk", x, dense.kernel)
        if dense.bias is not None:
            out = out + ops.expand_dims(dense.bias, 1)
        return out

    def build(
        self, query_shape: Shape, value_shape: Shape | None = None, key_shape: Shape | None = None
    ) -> None:
        value_shape = query_shape if value_shape is None else value_shape
        key_shape = value_shape if key_shape is None else key_shape
        for name, shape in (("query", query_shape), ("value", value_shape), ("key", key_shape)):
            check_rank3(name, shape)
        if None not in (key_shape[1], value_shape[1]) and key_shape[1] != value_shape[1]:
            raise ValueError(
                "`key` and `value` must have the same sequence length. Received: "
                f"key.shape={tuple(key_shape)}, value.shape={tuple(value_shape)}"
            )
        value_dim = self.value_dim or self.key_dim
        h, hkv = self.num_heads, self._kv_heads
        self.query_dense = self._einsum_dense(
            "btd,dhk->bthk", (None, h, self.key_dim), "hk", "query"
        )
        self.query_dense.build(query_shape)
        self.key_dense = self._einsum_dense("bsd,dhk->bshk", (None, hkv, self.key_dim), "hk", "key")
        self.key_dense.build(key_shape)
        self.value_dense = self._einsum_dense(
            "bsd,dhv->bshv", (None, hkv, value_dim), "hv", "value"
        )
        self.value_dense.build(value_shape)
        self.output_dense = self._einsum_dense(
            "bthv,hvd->btd",
            (None, self.output_dim or query_shape[-1]),
            "d",
            "attention_output",
            use_bias=self._output_bias,
        )
        self.output_dense.build((query_shape[0], query_shape[1], h, value_dim))
        head_shape = (query_shape[0], h, None, self.key_dim)
        self.score.build(head_shape, head_shape)
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
        cache: Tensor | None = None,
        cache_update_index: int | Tensor | None = None,
        position_ids: Tensor | None = None,
        score_bias: Tensor | None = None,
    ) -> Tensor | tuple[Tensor, ...]:
        if cache is not None:
            return self._call_cached(
                query, query_mask if query_mask is not None else mask, value_mask,
                attention_mask, cache, cache_update_index, return_attention_scores, training,
                score_bias,
            )  # fmt: skip
        query_mask, value_mask, key_mask = resolve_input_masks(
            value, key, query_mask, value_mask, key_mask, mask
        )
        value = query if value is None else value
        key = value if key is None else key

        use_dropout = self.dropout > 0 and bool(training)
        # jax.nn.dot_product_attention needs value heads as wide as key heads and has no
        # dropout; on TensorFlow the scaled-dot core is `attend_heads_last`, which takes both.
        same_width = (self.value_dim or self.key_dim) == self.key_dim
        fused = (
            self.score.is_scaled_dot
            and not return_attention_scores
            and score_bias is None
            and (on_tensorflow() or (same_width and not use_dropout))
        )
        if (
            fused
            and self.rope_max_wavelength is None
            and not self._quantized
            and is_onnx_tracing()
            and self._kv_heads == self.num_heads
            and same_width
            and not use_dropout
        ):
            merged = combined_mask(
                query_mask, value_mask, key_mask, attention_mask, use_causal_mask,
                ops.shape(query)[1], ops.shape(key)[1],
            )  # fmt: skip
            padding = None  # padding masks alone: kept apart for onnxruntime's mask index
            if merged is not None and attention_mask is None and not use_causal_mask:
                padding = (query_mask, key_side_mask(value_mask, key_mask))
            return attend_for_onnx(self, query, key, value, merged, padding)
        per_head = fused and not use_dropout and per_head_is_faster(query, key)
        # The fused kernel takes (B, T, H, d); scores take (B, H, T, d). Projecting straight
        # into the layout each path needs saves three transposes on the explicit path.
        layout = "bthk" if fused and not per_head else "bhtk"
        q = self._project(self.query_dense, query, layout)
        k = self._project(self.key_dense, key, layout)
        v = self._project(self.value_dense, value, layout)
        if self.rope_max_wavelength is not None:
            seq_axis = 1 if layout == "bthk" else 2
            q_positions, k_positions = position_ids, position_ids
            if position_ids is None:
                q_positions, k_positions = (ops.arange(ops.shape(t)[1]) for t in (query, key))
            q = self._rope(q, q_positions, seq_axis)
            k = self._rope(k, k_positions, seq_axis)
        k, v = self._share_kv_heads(k, v, head_axis=2 if layout == "bthk" else 1)

        return self._attend_projected(
            q, k, v, query_mask, value_mask, key_mask, attention_mask, use_causal_mask,
            fused, use_dropout, return_attention_scores, training, per_head=per_head,
            score_bias=score_bias,
        )  # fmt: skip

    def _rope(self, x, positions, sequence_axis):
        """Rotary positions on projected heads (no-op without `rope_max_wavelength`)."""
        if self.rope_max_wavelength is None:
            return x
        inv_freq = inverse_frequencies(self.key_dim, self.rope_max_wavelength, self.rope_scaling)
        return rotate(x, inv_freq, positions, sequence_axis)

    def _attend_projected(
        self, q, k, v, query_mask, value_mask, key_mask, attention_mask, use_causal_mask,
        fused, use_dropout, return_attention_scores, training, causal_offset=0, per_head=False,
        score_bias=None,
    ):  # fmt: skip
        """Masks, attention and W_O on projected heads, laid out as `fused` needs."""
        heads_first = per_head or not fused  # (B, H, T, d) rather than (B, T, H, d)
        seq_axis = 2 if heads_first else 1
        no_offset = isinstance(causal_offset, int) and causal_offset == 0
        only_causal = (
            no_offset
            and use_causal_mask
            and all(m is None for m in (query_mask, value_mask, key_mask, attention_mask))
        )
        merged = combined_mask(
            query_mask,
            value_mask,
            key_mask,
            attention_mask,
            use_causal_mask,
            ops.shape(q)[seq_axis],
            ops.shape(k)[seq_axis],
            offset=causal_offset,
        )
        if fused:
            # Scale the (T, d) queries, not the (T, S) scores: on backends without a fused
            # kernel that saves a full pass over the largest tensor (~10% at seq 2048 on CPU).
            q = ops.multiply(q, ops.cast(self.score.scale_for(self.key_dim), q.dtype))
            dropout = self.dropout_layer if use_dropout else None
            out = attend_scaled(q, k, v, merged, only_causal, per_head, dropout, training)
            weights = None
        else:
            head_mask = None if merged is None else ops.expand_dims(merged, 1)  # (B, 1, T, S)
            out, weights = attend(
                q,
                k,
                v,
                self.score,
                mask=head_mask,
                dropout=self.dropout_layer if use_dropout else None,
                training=training,
                bias=score_bias,
            )  # (B, H, T, dv)
        if not heads_first or self.output_dense.quantization_mode:
            if heads_first:
                out = ops.transpose(out, (0, 2, 1, 3))
            output = self.output_dense(out)
        else:
            output = ops.einsum("bhtv,hvd->btd", out, self.output_dense.kernel)
            if self._output_bias:
                output = output + self.output_dense.bias
        if return_attention_scores:
            return output, weights
        return output

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "num_heads": self.num_heads,
            "key_dim": self.key_dim,
            "value_dim": self.value_dim,
            "num_key_value_heads": self.num_key_value_heads,
            "dropout": self.dropout,
            "use_bias": self.use_bias,
            "output_use_bias": self.output_use_bias,
            "rope_max_wavelength": self.rope_max_wavelength,
            "rope_scaling": self.rope_scaling,
            "output_dim": self.output_dim,
            "score": serialize_score(self._score_arg, self.score),
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            "bias_initializer": keras.initializers.serialize(self.bias_initializer),
        }
