"""What the encoder and decoder blocks share: arguments, sublayer factories, residual wiring."""

from typing import Any

import keras

from keras_attn.layers.feed_forward import FeedForward, get_activation
from keras_attn.layers.multi_head_attention import MultiHeadAttention
from keras_attn.layers.rotary_embedding import check_rope_scaling
from keras_attn.layers.scores import Score, get_score, serialize_score
from keras_attn.types import Initializer

NORMALIZATIONS = ("layer_norm", "rms_norm")


def normalization_layer(kind: str, epsilon: float, name: str, **kwargs: Any) -> keras.layers.Layer:
    """`LayerNormalization` (`"layer_norm"`) or `RMSNormalization` (`"rms_norm"`: `x /
    sqrt(mean(x²) + ε) · scale`, no centring, no bias; Llama's RMSNorm)."""
    if kind == "rms_norm":
        layer = keras.layers.RMSNormalization(epsilon=epsilon, name=name, **kwargs)
        layer.supports_masking = True  # per position: a padding mask passes through
        return layer
    return keras.layers.LayerNormalization(epsilon=epsilon, name=name, **kwargs)


class TransformerBlock(keras.layers.Layer):
    """Base of `TransformerEncoder` and `TransformerDecoder` (not used on its own).

    Every sublayer `f` is wrapped as `LayerNorm(x + Dropout(f(x)))` (post-norm, Vaswani et al.)
    or `x + Dropout(f(LayerNorm(x)))` (pre-norm, `normalize_first=True`, GPT-2).

    The Llama family's block is pre-norm with `normalization="rms_norm"`,
    `gated_feed_forward=True, activation="silu"` (SwiGLU), `rope_max_wavelength` (rotary
    queries and keys), `num_key_value_heads` and no biases (`attention_bias=False,
    feed_forward_bias=False`; Qwen2 keeps q, k, v biases: `attention_output_bias=False`).
    """

    def __init__(
        self,
        num_heads: int,
        intermediate_dim: int,
        dropout: float = 0.0,
        attention_dropout: float | None = None,
        activation: str = "relu",
        normalize_first: bool = False,
        layer_norm_epsilon: float = 1e-5,
        key_dim: int | None = None,
        num_key_value_heads: int | None = None,
        score: str | dict[str, Any] | Score = "scaled_dot",
        kernel_initializer: Initializer = "glorot_uniform",
        bias_initializer: Initializer = "zeros",
        normalization: str = "layer_norm",
        gated_feed_forward: bool = False,
        attention_bias: bool = True,
        attention_output_bias: bool | None = None,
        feed_forward_bias: bool = True,
        rope_max_wavelength: float | None = None,
        rope_scaling: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if normalization not in NORMALIZATIONS:
            raise ValueError(
                f"`normalization` must be one of {list(NORMALIZATIONS)}. "
                f"Received: normalization={normalization!r}"
            )
        value: float | None  # both checking loops below bind it
        for name, value in (("num_heads", num_heads), ("intermediate_dim", intermediate_dim)):
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"`{name}` must be a positive integer. Received: {name}={value!r}")
        for name, value in (("dropout", dropout), ("attention_dropout", attention_dropout)):
            if value is not None and not 0.0 <= value < 1.0:
                raise ValueError(f"`{name}` must be in [0, 1). Received: {name}={value}")
        if not layer_norm_epsilon > 0:
            raise ValueError(
                f"`layer_norm_epsilon` must be positive. Received: layer_norm_epsilon="
                f"{layer_norm_epsilon}"
            )
        get_activation(activation)  # validates the name
        if rope_max_wavelength is not None and (
            isinstance(rope_max_wavelength, bool) or not rope_max_wavelength > 1
        ):
            raise ValueError(
                "`rope_max_wavelength` must be greater than 1 (or None: no rotary positions). "
                f"Received: rope_max_wavelength={rope_max_wavelength!r}"
            )
        if rope_scaling is not None and rope_max_wavelength is None:
            raise ValueError(
                "`rope_scaling` scales rotary positions: it needs `rope_max_wavelength`. "
                f"Received: rope_scaling={rope_scaling!r}, rope_max_wavelength=None"
            )
        rope_scaling = check_rope_scaling(rope_scaling)
        self.num_heads = num_heads
        self.intermediate_dim = intermediate_dim
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.activation = activation
        self.normalize_first = normalize_first
        self.layer_norm_epsilon = layer_norm_epsilon
        self.key_dim = key_dim
        self.num_key_value_heads = num_key_value_heads
        self._score_arg = score
        # Validated here; each attention sublayer builds its own. Kept out of Keras's layer
        # tracking: an unbuilt sublayer would stop `model.quantize()` and weigh in saving.
        object.__setattr__(self, "_validated_score", get_score(score))
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.normalization = normalization
        self.gated_feed_forward = gated_feed_forward
        self.attention_bias = attention_bias
        self.attention_output_bias = attention_output_bias
        self.feed_forward_bias = feed_forward_bias
        self.rope_max_wavelength = rope_max_wavelength
        self.rope_scaling = rope_scaling
        self.supports_masking = True

    def _head_dim(self, hidden_dim):
        if self.key_dim is not None:
            return self.key_dim
        if hidden_dim is None or hidden_dim % self.num_heads:
            raise ValueError(
                "The model width must be divisible by `num_heads` (or pass `key_dim`). "
                f"Received: width={hidden_dim}, num_heads={self.num_heads}"
            )
        return hidden_dim // self.num_heads

    def _attention(self, hidden_dim, name):
        score = self._score_arg
        if not isinstance(score, str):  # a fresh copy per sublayer, so weights are not shared
            score = serialize_score(score, self._validated_score)
        return MultiHeadAttention(
            num_heads=self.num_heads,
            key_dim=self._head_dim(hidden_dim),
            num_key_value_heads=self.num_key_value_heads,
            dropout=self.dropout if self.attention_dropout is None else self.attention_dropout,
            score=score,
            kernel_initializer=self.kernel_initializer,
            bias_initializer=self.bias_initializer,
            use_bias=self.attention_bias,
            output_use_bias=self.attention_output_bias,
            # Rotary positions are the self-attention's: cross-attention keys are the encoder's.
            rope_max_wavelength=self.rope_max_wavelength if name == "self_attention" else None,
            rope_scaling=self.rope_scaling if name == "self_attention" else None,
            dtype=self.dtype_policy,
            name=name,
        )

    def _feed_forward(self):
        return FeedForward(
            self.intermediate_dim,
            activation=self.activation,
            kernel_initializer=self.kernel_initializer,
            bias_initializer=self.bias_initializer,
            use_bias=self.feed_forward_bias,
            gated=self.gated_feed_forward,
            dtype=self.dtype_policy,
            name="feed_forward",
        )

    def _layer_norm(self, name):
        return normalization_layer(
            self.normalization, self.layer_norm_epsilon, name, dtype=self.dtype_policy
        )

    def _dropout(self):
        return keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)

    @staticmethod
    def _attend(layer, return_scores, *args, **kwargs):
        """Calls an attention sublayer; returns `(output, weights or None)`."""
        if return_scores:
            return layer(*args, return_attention_scores=True, **kwargs)
        return layer(*args, **kwargs), None

    @staticmethod
    def _attend_cached(layer, return_scores, *args, **kwargs):
        """Calls an attention sublayer with a `cache`; returns `(output, weights or None,
        cache)`."""
        *outputs, cache = layer(*args, return_attention_scores=return_scores, **kwargs)
        return outputs[0], (outputs[1] if return_scores else None), cache

    def _residual(self, x, norm, sublayer, dropout, training):
        """Applies `sublayer` (returning `(output, extra)`) with residual, dropout and LayerNorm."""
        h = norm(x) if self.normalize_first else x
        h, extra = sublayer(h)
        x = x + dropout(h, training=training)
        if not self.normalize_first:
            x = norm(x)
        return x, extra

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "num_heads": self.num_heads,
            "intermediate_dim": self.intermediate_dim,
            "dropout": self.dropout,
            "attention_dropout": self.attention_dropout,
            "activation": self.activation,
            "normalize_first": self.normalize_first,
            "layer_norm_epsilon": self.layer_norm_epsilon,
            "key_dim": self.key_dim,
            "num_key_value_heads": self.num_key_value_heads,
            "score": serialize_score(self._score_arg, self._validated_score),
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            "normalization": self.normalization,
            "gated_feed_forward": self.gated_feed_forward,
            "attention_bias": self.attention_bias,
            "attention_output_bias": self.attention_output_bias,
            "feed_forward_bias": self.feed_forward_bias,
            "rope_max_wavelength": self.rope_max_wavelength,
            "rope_scaling": self.rope_scaling,
        }
