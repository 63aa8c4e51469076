"""Transformer encoder block: self-attention, then a position-wise feed-forward network."""

import keras

from keras_attn.layers.transformer_block import TransformerBlock
from keras_attn.types import Shape, Tensor


@keras.saving.register_keras_serializable(package="keras_attn")
class TransformerEncoder(TransformerBlock):
    """Transformer encoder block: self-attention, then a position-wise feed-forward network.

    Each sublayer is wrapped in a residual connection and LayerNorm, applied after the sublayer
    (post-norm, as in Vaswani et al.) or before it (`normalize_first=True`, pre-norm).

    Args:
        num_heads: int. Number of attention heads.
        intermediate_dim: int. Hidden size of the feed-forward network.
        dropout: float. Dropout after each sublayer (and on attention weights unless
            `attention_dropout` is given). Defaults to `0.0`.
        attention_dropout: optional float. Dropout on the attention weights.
        activation: feed-forward activation: `"relu"` (default), `"gelu"`, `"gelu_tanh"`,
            `"swish"`.
        normalize_first: bool. Pre-norm instead of post-norm. Defaults to `False`.
        layer_norm_epsilon: float. Defaults to `1e-5`.
        key_dim: optional int. Head size; defaults to `width // num_heads`.
        num_key_value_heads: optional int. Grouped-query attention.
        score: attention score (see `MultiHeadAttention`). Defaults to `"scaled_dot"`.
        kernel_initializer, bias_initializer: initializers of every dense projection.
        normalization: `"layer_norm"` (default) or `"rms_norm"` (Llama's RMSNorm).
        gated_feed_forward: bool. Gated feed-forward (`activation="silu"`: SwiGLU).
        attention_bias: bool. Biases in W_q, W_k, W_v (and W_O). Defaults to `True`.
        attention_output_bias: optional bool. Bias in W_O; defaults to `attention_bias`.
        feed_forward_bias: bool. Biases in the feed-forward network. Defaults to `True`.
        rope_max_wavelength: optional float. Rotary positions on queries and keys (Llama's
            `rope_theta`); `rope_scaling`: Hugging Face's dict (see `RotaryEmbedding`).
    Call arguments:
        inputs: float tensor `(batch, seq_len, hidden_dim)`.
        padding_mask: optional bool tensor `(batch, seq_len)`; `True` = real token. Filled in
            from Keras mask propagation (e.g. `mask_zero=True` embeddings) when not given.
        attention_mask: optional bool `(batch, seq_len, seq_len)`; ANDed with the padding mask.
        use_causal_mask: bool. Causal self-attention. Defaults to `False`.
        return_attention_scores: bool. Also return the weights `(batch, heads, seq, seq)`.
        score_bias: optional float, broadcastable to `(batch, heads, seq, seq)`: added to the
            attention scores (T5's relative position bias from `RelativePositionBias`).
    Returns:
        float tensor `(batch, seq_len, hidden_dim)` (and the weights when asked for). At padded
        positions attention contributes zeros; only real positions carry meaning.
    Example:
        >>> x = keras.random.normal((2, 8, 64))
        >>> tuple(TransformerEncoder(num_heads=4, intermediate_dim=128)(x).shape)
        (2, 8, 64)
    """

    def build(self, inputs_shape: Shape) -> None:
        if len(inputs_shape) != 3:
            raise ValueError(
                "`inputs` must have shape (batch, seq_len, hidden_dim). "
                f"Received: inputs.shape={tuple(inputs_shape)}"
            )
        hidden_dim = inputs_shape[-1]
        # Self-attention block.
        self.self_attention = self._attention(hidden_dim, "self_attention")
        self.self_attention.build(inputs_shape)
        self.self_attention_layer_norm = self._layer_norm("self_attention_layer_norm")
        self.self_attention_layer_norm.build(inputs_shape)
        self.self_attention_dropout = self._dropout()
        # Feed-forward block.
        self.feed_forward = self._feed_forward()
        self.feed_forward.build(inputs_shape)
        self.feed_forward_layer_norm = self._layer_norm("feed_forward_layer_norm")
        self.feed_forward_layer_norm.build(inputs_shape)
        self.feed_forward_dropout = self._dropout()

    def call(
        self,
        inputs: Tensor,
        padding_mask: Tensor | None = None,
        attention_mask: Tensor | None = None,
        use_causal_mask: bool = False,
        return_attention_scores: bool = False,
        training: bool | None = None,
        mask: Tensor | None = None,
        inputs_mask: Tensor | None = None,
        score_bias: Tensor | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        # Keras delivers the propagated mask as `mask` (one tensor passed) or `inputs_mask`.
        if padding_mask is None:
            padding_mask = mask if mask is not None else inputs_mask

        def self_attention(x: Tensor) -> tuple[Tensor, Tensor | None]:
            return self._attend(
                self.self_attention,
                return_attention_scores,
                x,
                query_mask=padding_mask,
                value_mask=padding_mask,
                attention_mask=attention_mask,
                use_causal_mask=use_causal_mask,
                training=training,
                **({} if score_bias is None else {"score_bias": score_bias}),
            )

        x, scores = self._residual(
            inputs,
            self.self_attention_layer_norm,
            self_attention,
            self.self_attention_dropout,
            training,
        )
        x, _ = self._residual(
            x,
            self.feed_forward_layer_norm,
            lambda h: (self.feed_forward(h, training=training), None),
            self.feed_forward_dropout,
            training,
        )
        if return_attention_scores:
            return x, scores
        return x

    def compute_mask(self, inputs: Tensor, mask: Tensor | None = None) -> Tensor | None:
        return mask
