"""Embeddings: tokens, segments, learned and sinusoidal positions, and their sum.

Position layers return the position vectors (broadcast to the input's shape) rather than adding
them, so they compose with any token embedding; `TokenAndPositionEmbedding` does the adding.
"""

import math
from typing import Any

import keras
from keras import ops

from keras_attn.checks import check_positive_int
from keras_attn.types import DType, Initializer, Shape, Tensor


def _check_length(layer, name, length, limit):
    if length is not None and length > limit:
        raise ValueError(
            f"`{layer.name}` handles sequences up to `sequence_length={limit}`. "
            f"Received: {name} of length {length}"
        )


@keras.saving.register_keras_serializable(package="keras_attn")
class TokenEmbedding(keras.layers.Layer):
    """Token ids to vectors, and (tied) vectors back to vocabulary logits.

    `call(ids)` looks up the embedding matrix `E (vocabulary_size, embedding_dim)`;
    `call(hidden, reverse=True)` computes `hidden · Eᵀ`, the output projection of a language
    model whose input and output embeddings are tied.

    Args:
        vocabulary_size: int. Number of token ids.
        embedding_dim: int. Size of each vector.
        mask_zero: bool. Id 0 is padding: the layer emits a padding mask (`True` = real token)
            that Keras carries to every later layer. Defaults to `False`.
        embeddings_initializer: initializer of `E`. Defaults to `"glorot_uniform"`.
        tie_weights: bool. `reverse=True` projects with `E` itself (GPT-2); `False` gives the
            output projection its own matrix `reverse_embeddings (vocabulary_size,
            embedding_dim)` (Llama's untied `lm_head`). Defaults to `True`.
        reverse_bias: bool. `reverse=True` adds a bias `reverse_bias (vocabulary_size,)` to
            the logits (BART's and Marian's `final_logits_bias`). Defaults to `False`.
    Call arguments:
        inputs: int ids `(batch, seq_len)`, or with `reverse=True` float `(..., embedding_dim)`.
        reverse: bool. Project to logits with `Eᵀ` (or the untied matrix) instead of looking
            up.
    Returns:
        `(batch, seq_len, embedding_dim)`, or logits `(..., vocabulary_size)` with `reverse`.
    Example:
        >>> emb = TokenEmbedding(100, 16, mask_zero=True)
        >>> h = emb(ops.array([[5, 7, 0]])); tuple(emb(h, reverse=True).shape)
        (1, 3, 100)
    """

    def __init__(
        self,
        vocabulary_size: int,
        embedding_dim: int,
        mask_zero: bool = False,
        embeddings_initializer: Initializer = "glorot_uniform",
        tie_weights: bool = True,
        reverse_bias: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        check_positive_int("vocabulary_size", vocabulary_size)
        check_positive_int("embedding_dim", embedding_dim)
        self.tie_weights = bool(tie_weights)
        self.reverse_bias = bool(reverse_bias)
        self.vocabulary_size = vocabulary_size
        self.embedding_dim = embedding_dim
        self.mask_zero = mask_zero
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)
        self.supports_masking = mask_zero

    def build(self, inputs_shape: Shape | None = None) -> None:
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.vocabulary_size, self.embedding_dim),
            initializer=self.embeddings_initializer,
        )
        self.reverse_embeddings = None
        if not self.tie_weights:
            self.reverse_embeddings = self.add_weight(
                name="reverse_embeddings",
                shape=(self.vocabulary_size, self.embedding_dim),
                initializer=self.embeddings_initializer,
            )
        self.logits_bias = None
        if self.reverse_bias:
            self.logits_bias = self.add_weight(
                name="reverse_bias", shape=(self.vocabulary_size,), initializer="zeros"
            )

    def call(self, inputs: Tensor, reverse: bool = False) -> Tensor:
        if reverse:
            if inputs.shape[-1] is not None and inputs.shape[-1] != self.embedding_dim:
                raise ValueError(
                    f"`reverse=True` needs inputs of depth embedding_dim={self.embedding_dim}. "
                    f"Received: inputs.shape={tuple(inputs.shape)}"
                )
            table = self.embeddings if self.reverse_embeddings is None else self.reverse_embeddings
            kernel = ops.cast(table, self.compute_dtype)
            logits = ops.matmul(inputs, ops.transpose(kernel))
            if self.logits_bias is not None:
                logits = logits + ops.cast(self.logits_bias, self.compute_dtype)
            return logits
        if "int" not in keras.backend.standardize_dtype(inputs.dtype):
            inputs = ops.cast(inputs, "int32")
        return ops.take(self.embeddings, inputs, axis=0)

    def compute_mask(self, inputs: Tensor, mask: Tensor | None = None) -> Tensor | None:
        if not self.mask_zero:
            return None
        if "float" in keras.backend.standardize_dtype(inputs.dtype):
            return mask  # reverse projection: the mask of the hidden states carries through.
        return ops.not_equal(inputs, 0)

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "vocabulary_size": self.vocabulary_size,
            "embedding_dim": self.embedding_dim,
            "mask_zero": self.mask_zero,
            "embeddings_initializer": keras.initializers.serialize(self.embeddings_initializer),
            "tie_weights": self.tie_weights,
            "reverse_bias": self.reverse_bias,
        }


@keras.saving.register_keras_serializable(package="keras_attn")
class SegmentEmbedding(TokenEmbedding):
    """Segment ids (sentence A = 0, sentence B = 1, …) to vectors, as in BERT.

    Args:
        num_segments: int. Number of segment ids.
        embedding_dim: int. Size of each vector.
        embeddings_initializer: initializer. Defaults to `"glorot_uniform"`.
    """

    def __init__(
        self,
        num_segments: int,
        embedding_dim: int,
        embeddings_initializer: Initializer = "glorot_uniform",
        **kwargs: Any,
    ) -> None:
        check_positive_int("num_segments", num_segments)
        super().__init__(num_segments, embedding_dim, False, embeddings_initializer, **kwargs)
        self.num_segments = num_segments

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        del config["vocabulary_size"], config["mask_zero"], config["tie_weights"]
        return {**config, "num_segments": self.num_segments}


@keras.saving.register_keras_serializable(package="keras_attn")
class PositionEmbedding(keras.layers.Layer):
    """Learned absolute position embeddings, one vector per position up to `sequence_length`.

    Args:
        sequence_length: int. Longest sequence the layer handles.
        initializer: initializer of the table. Defaults to `"glorot_uniform"`.
    Call arguments:
        inputs: `(batch, seq_len, dim)`: the embeddings the positions will be added to.
        start_index: int or scalar tensor. Position of the first step (for cached decoding).
        position_ids: optional int `(batch, seq_len)`: each token's position, overriding
            `start_index` (left-padded rows start later: Hugging Face's `position_ids`).
    Returns:
        `(batch, seq_len, dim)` position vectors, broadcast over the batch.
    """

    def __init__(
        self, sequence_length: int, initializer: Initializer = "glorot_uniform", **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        check_positive_int("sequence_length", sequence_length)
        self.sequence_length = sequence_length
        self.initializer = keras.initializers.get(initializer)
        self.supports_masking = True

    def build(self, inputs_shape: Shape) -> None:
        if len(inputs_shape) < 2 or inputs_shape[-1] is None:
            raise ValueError(
                "`inputs` must have shape (batch, seq_len, dim) with a known dim. "
                f"Received: inputs.shape={tuple(inputs_shape)}"
            )
        _check_length(self, "inputs", inputs_shape[-2], self.sequence_length)
        self.position_embeddings = self.add_weight(
            name="embeddings",
            shape=(self.sequence_length, inputs_shape[-1]),
            initializer=self.initializer,
        )

    def call(
        self, inputs: Tensor, start_index: int | Tensor = 0, position_ids: Tensor | None = None
    ) -> Tensor:
        shape = ops.shape(inputs)
        length, dim = shape[-2], shape[-1]
        table = ops.cast(self.position_embeddings, self.compute_dtype)
        if isinstance(inputs.shape[-2], int) and isinstance(start_index, int):
            # Known while tracing or eager: a clear error instead of a Slice op failure.
            _check_length(self, "inputs", start_index + inputs.shape[-2], self.sequence_length)
        if position_ids is not None:
            return ops.take(table, ops.cast(position_ids, "int32"), axis=0)
        positions = ops.slice(table, (start_index, 0), (length, dim))
        return ops.broadcast_to(positions, shape)

    def compute_output_shape(self, inputs_shape: Shape) -> Shape:
        return inputs_shape

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "sequence_length": self.sequence_length,
            "initializer": keras.initializers.serialize(self.initializer),
        }


SINUSOIDAL_LAYOUTS = ("interleaved", "halves")


def sinusoidal_encoding(
    positions: Tensor,
    dim: int,
    max_wavelength: float = 10000.0,
    dtype: DType = "float32",
    layout: str = "interleaved",
) -> Tensor:
    """Vaswani's encoding for float positions `(T,)`: `(T, dim)` with
    `PE[p, 2i] = sin(p / max_wavelength^(2i/dim))`, `PE[p, 2i+1] = cos(same angle)`;
    `layout="halves"` puts every sine first, then every cosine (`PE[p, i]` and
    `PE[p, dim/2 + i]`; Marian's and tensor2tensor's layout)."""
    index = ops.arange(dim, dtype="float32")
    if layout == "halves":
        half = (dim + 1) // 2
        pair = ops.where(index < half, index, index - half) * 2.0
        is_sine = index < half
    else:
        pair = ops.floor(index / 2.0) * 2.0  # 2i for both members of a sin/cos pair
        is_sine = ops.equal(ops.mod(ops.arange(dim), 2), 0)
    inv_freq = ops.exp(-math.log(max_wavelength) * pair / dim)  # (dim,)
    angles = ops.expand_dims(ops.cast(positions, "float32"), -1) * inv_freq  # (T, dim)
    return ops.cast(ops.where(is_sine, ops.sin(angles), ops.cos(angles)), dtype)


@keras.saving.register_keras_serializable(package="keras_attn")
class SinusoidalPositionEncoding(keras.layers.Layer):
    """Fixed sinusoidal position encoding (Vaswani et al.); no weights, any length, any width.

    Args:
        max_wavelength: float. Longest wavelength, `10000` in the paper.
        layout: `"interleaved"` (sine and cosine alternate, as the paper writes it; the
            default) or `"halves"` (all sines, then all cosines: Marian).
    Call arguments:
        inputs: `(batch, seq_len, dim)`. start_index: position of the first step.
        position_ids: optional int `(batch, seq_len)`, overriding `start_index`.
    Returns:
        `(batch, seq_len, dim)` encodings, broadcast over the batch.
    """

    def __init__(
        self, max_wavelength: float = 10000, layout: str = "interleaved", **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        if layout not in SINUSOIDAL_LAYOUTS:
            raise ValueError(
                f"`layout` must be one of {SINUSOIDAL_LAYOUTS}. Received: layout={layout!r}"
            )
        self.layout = layout
        if not max_wavelength > 1:
            raise ValueError(
                "`max_wavelength` must be greater than 1. "
                f"Received: max_wavelength={max_wavelength}"
            )
        self.max_wavelength = max_wavelength
        self.supports_masking = True

    def build(self, inputs_shape: Shape) -> None:
        if len(inputs_shape) < 2 or inputs_shape[-1] is None:
            raise ValueError(
                "`inputs` must have shape (batch, seq_len, dim) with a known dim. "
                f"Received: inputs.shape={tuple(inputs_shape)}"
            )

    def call(
        self, inputs: Tensor, start_index: int | Tensor = 0, position_ids: Tensor | None = None
    ) -> Tensor:
        shape = ops.shape(inputs)
        if position_ids is not None:  # (batch, seq) -> (batch, seq, dim)
            return sinusoidal_encoding(
                position_ids, inputs.shape[-1], self.max_wavelength, self.compute_dtype,
                self.layout,
            )  # fmt: skip
        positions = ops.add(
            ops.arange(shape[-2], dtype="float32"), ops.cast(start_index, "float32")
        )
        encoding = sinusoidal_encoding(
            positions, inputs.shape[-1], self.max_wavelength, self.compute_dtype, self.layout
        )
        return ops.broadcast_to(encoding, shape)

    def compute_output_shape(self, inputs_shape: Shape) -> Shape:
        return inputs_shape

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "max_wavelength": self.max_wavelength,
            "layout": self.layout,
        }
