"""Transformer decoder block: causal self-attention, optional cross-attention, feed-forward."""

import keras

from keras_attn.layers.transformer_block import TransformerBlock
from keras_attn.types import Shape, Tensor


@keras.saving.register_keras_serializable(package="keras_attn")
class TransformerDecoder(TransformerBlock):
    """Transformer decoder block: causal self-attention, cross-attention, feed-forward network.

    Cross-attention over `encoder_sequence` is created when the block is first called with one
    (encoder-decoder models); called without, the block is a GPT-style decoder-only block. Each
    sublayer has its residual connection, dropout and LayerNorm (post- or pre-norm).

    Args:
        Same as `TransformerEncoder`.
    Call arguments:
        decoder_sequence: float `(batch, T, hidden_dim)`.
        encoder_sequence: optional float `(batch, S, encoder_dim)`.
        decoder_padding_mask: optional bool `(batch, T)`; from mask propagation if not given.
        decoder_attention_mask: optional bool `(batch, T, T)`, ANDed with the causal mask.
        encoder_padding_mask: optional bool `(batch, S)`; from mask propagation if not given.
        encoder_attention_mask: optional bool `(batch, T, S)`.
        use_causal_mask: bool. Defaults to `True`.
        return_attention_scores: bool. Also return the self-attention weights (and the
            cross-attention weights when there is cross-attention).
        self_attention_cache: optional `(batch, 2, max_length, kv_heads, key_dim)` key/value
            cache for incremental decoding (see `MultiHeadAttention`); `decoder_padding_mask`
            then covers the whole cache.
        self_attention_cache_update_index: int or scalar tensor: where the new tokens go.
        cross_attention_cache: optional `(batch, 2, S, kv_heads, key_dim)` keys and values of
            the encoder sequence from `block.cross_attention.key_value_cache(encoder_sequence)`,
            computed once for a whole decoding; `encoder_sequence` may then be omitted.
        position_ids: optional int `(batch, T)`: rotary positions of the tokens (left padding),
            for blocks with `rope_max_wavelength`.
        score_bias: optional float, broadcastable to `(batch, heads, T, T)` (with a cache,
            `(…, T, max_length)`): added to the self-attention scores (T5's relative position
            bias, computed once by `RelativePositionBias` and shared by every block).
    Returns:
        `(batch, T, hidden_dim)`; with `return_attention_scores`, `(outputs, self_weights)` or
        `(outputs, self_weights, cross_weights)`; with a cache, the updated cache comes last.
    Example:
        >>> dec = TransformerDecoder(num_heads=4, intermediate_dim=128)
        >>> tuple(dec(keras.random.normal((2, 5, 64)), keras.random.normal((2, 9, 64))).shape)
        (2, 5, 64)
    """

    def build(
        self, decoder_sequence_shape: Shape, encoder_sequence_shape: Shape | None = None
    ) -> None:
        if len(decoder_sequence_shape) != 3:
            raise ValueError(
                "`decoder_sequence` must have shape (batch, seq_len, hidden_dim). "
                f"Received: decoder_sequence.shape={tuple(decoder_sequence_shape)}"
            )
        hidden_dim = decoder_sequence_shape[-1]
        # Causal self-attention block.
        self.self_attention = self._attention(hidden_dim, "self_attention")
        self.self_attention.build(decoder_sequence_shape)
        self.self_attention_layer_norm = self._layer_norm("self_attention_layer_norm")
        self.self_attention_layer_norm.build(decoder_sequence_shape)
        self.self_attention_dropout = self._dropout()
        # Cross-attention block, only for encoder-decoder models.
        self.cross_attention = None
        if encoder_sequence_shape is not None:
            if len(encoder_sequence_shape) != 3:
                raise ValueError(
                    "`encoder_sequence` must have shape (batch, seq_len, dim). "
                    f"Received: encoder_sequence.shape={tuple(encoder_sequence_shape)}"
                )
            self.cross_attention = self._attention(hidden_dim, "cross_attention")
            self.cross_attention.build(decoder_sequence_shape, encoder_sequence_shape)
            self.cross_attention_layer_norm = self._layer_norm("cross_attention_layer_norm")
            self.cross_attention_layer_norm.build(decoder_sequence_shape)
            self.cross_attention_dropout = self._dropout()
        # Feed-forward block.
        self.feed_forward = self._feed_forward()
        self.feed_forward.build(decoder_sequence_shape)
        self.feed_forward_layer_norm = self._layer_norm("feed_forward_layer_norm")
        self.feed_forward_layer_norm.build(decoder_sequence_shape)
        self.feed_forward_dropout = self._dropout()

    def call(
        self,
        decoder_sequence: Tensor,
        encoder_sequence: Tensor | None = None,
        decoder_padding_mask: Tensor | None = None,
        decoder_attention_mask: Tensor | None = None,
        encoder_padding_mask: Tensor | None = None,
        encoder_attention_mask: Tensor | None = None,
        use_causal_mask: bool = True,
        return_attention_scores: bool = False,
        training: bool | None = None,
        mask: Tensor | None = None,
        decoder_sequence_mask: Tensor | None = None,
        encoder_sequence_mask: Tensor | None = None,
        self_attention_cache: Tensor | None = None,
        self_attention_cache_update_index: int | Tensor | None = None,
        cross_attention_cache: Tensor | None = None,
        position_ids: Tensor | None = None,
        score_bias: Tensor | None = None,
    ) -> Tensor | tuple[Tensor, ...]:
        # Incremental decoding reads only a padding mask passed as such: one that Keras
        # propagates from the new tokens' embedding covers them, not the whole cache.
        cache_padding_mask = decoder_padding_mask
        # Keras delivers propagated masks as `mask` (one tensor passed) or `<arg>_mask`.
        if decoder_padding_mask is None:
            decoder_padding_mask = mask if mask is not None else decoder_sequence_mask
        if encoder_padding_mask is None:
            encoder_padding_mask = encoder_sequence_mask
        has_encoder = encoder_sequence is not None or cross_attention_cache is not None
        if has_encoder != (self.cross_attention is not None):
            raise ValueError(
                "`encoder_sequence` must be given exactly when the block has cross-attention "
                "(it is created by the first call with an encoder sequence). Received: "
                f"encoder_sequence={'None' if encoder_sequence is None else 'a tensor'}, "
                f"has cross-attention: {self.cross_attention is not None}"
            )

        new_cache = []

        def self_attention(x: Tensor) -> tuple[Tensor, Tensor | None]:
            if self_attention_cache is None:
                return self._attend(
                    self.self_attention,
                    return_attention_scores,
                    x,
                    query_mask=decoder_padding_mask,
                    value_mask=decoder_padding_mask,
                    attention_mask=decoder_attention_mask,
                    use_causal_mask=use_causal_mask,
                    training=training,
                    **({} if position_ids is None else {"position_ids": position_ids}),
                    **({} if score_bias is None else {"score_bias": score_bias}),
                )
            # Incremental decoding: the padding mask, if any, covers the whole cache.
            output, scores, cache = self._attend_cached(
                self.self_attention,
                return_attention_scores,
                x,
                value_mask=cache_padding_mask,
                cache=self_attention_cache,
                cache_update_index=self_attention_cache_update_index,
                training=training,
                **({} if score_bias is None else {"score_bias": score_bias}),
            )
            new_cache.append(cache)
            return output, scores

        def cross_attention(x: Tensor) -> tuple[Tensor, Tensor | None]:
            if cross_attention_cache is not None:
                output, scores, _ = self._attend_cached(
                    self.cross_attention,
                    return_attention_scores,
                    x,
                    value_mask=encoder_padding_mask,
                    attention_mask=encoder_attention_mask,
                    cache=cross_attention_cache,
                    training=training,
                )
                return output, scores
            return self._attend(
                self.cross_attention,
                return_attention_scores,
                x,
                encoder_sequence,
                query_mask=decoder_padding_mask,
                value_mask=encoder_padding_mask,
                attention_mask=encoder_attention_mask,
                training=training,
            )

        x, self_scores = self._residual(
            decoder_sequence,
            self.self_attention_layer_norm,
            self_attention,
            self.self_attention_dropout,
            training,
        )
        cross_scores = None
        if self.cross_attention is not None:
            x, cross_scores = self._residual(
                x,
                self.cross_attention_layer_norm,
                cross_attention,
                self.cross_attention_dropout,
                training,
            )
        x, _ = self._residual(
            x,
            self.feed_forward_layer_norm,
            lambda h: (self.feed_forward(h, training=training), None),
            self.feed_forward_dropout,
            training,
        )
        outputs: tuple[Tensor, ...] = (x,)
        if return_attention_scores:
            outputs += (
                (self_scores,) if self.cross_attention is None else (self_scores, cross_scores)
            )
        if self_attention_cache is not None:
            outputs += (new_cache[0],)
        return outputs[0] if len(outputs) == 1 else outputs

    def compute_mask(self, decoder_sequence: Tensor, mask: Tensor | None = None) -> Tensor | None:
        return mask
