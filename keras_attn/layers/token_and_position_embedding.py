"""Token + position (+ segment) embeddings, summed, then optional LayerNorm and dropout (BERT)."""

from typing import Any

import keras
from keras import ops

from keras_attn.layers.embeddings import (
    PositionEmbedding,
    SegmentEmbedding,
    SinusoidalPositionEncoding,
    TokenEmbedding,
)
from keras_attn.layers.initializers import fresh
from keras_attn.types import Initializer, Shape, Tensor

POSITION_ENCODINGS = ("learned", "sinusoidal")


def position_encoding_layer(
    position_encoding: str, sequence_length: int | None, name: str, **kwargs: Any
) -> PositionEmbedding | SinusoidalPositionEncoding:
    """`PositionEmbedding(sequence_length)` for `"learned"`, `SinusoidalPositionEncoding` for
    `"sinusoidal"`; `kwargs` (dtype, initializer) go to the learned table."""
    if position_encoding not in POSITION_ENCODINGS:
        raise ValueError(
            f"`position_encoding` must be one of {POSITION_ENCODINGS}. "
            f"Received: position_encoding={position_encoding!r}"
        )
    if position_encoding == "learned":
        # `None` (enough for sinusoidal encodings) is rejected by PositionEmbedding's check.
        return PositionEmbedding(sequence_length, name=name, **kwargs)  # type: ignore[arg-type]
    kwargs.pop("initializer", None)
    return SinusoidalPositionEncoding(name=name, **kwargs)


@keras.saving.register_keras_serializable(package="keras_attn")
class TokenAndPositionEmbedding(keras.layers.Layer):
    """The input layer of a Transformer: `token(ids) + position(t) [+ segment(s)]`.

    Args:
        vocabulary_size: int. Number of token ids.
        sequence_length: int. Longest sequence (size of the learned position table).
        embedding_dim: int. Width of the model.
        num_segments: optional int. Adds segment embeddings (BERT's sentence A/B).
        position_encoding: `"learned"` (default) or `"sinusoidal"`.
        mask_zero: bool. Id 0 is padding; the padding mask then reaches every later layer.
        use_layer_norm: bool. LayerNorm after the sum, as BERT does. Defaults to `False`.
        layer_norm_epsilon: float. Defaults to `1e-12` (BERT's).
        dropout: float. Dropout after the sum (and LayerNorm). Defaults to `0.0`.
        embeddings_initializer: initializer of the token, position and segment tables.
    Call arguments:
        token_ids: int `(batch, seq_len)`.
        segment_ids: optional int `(batch, seq_len)`; needs `num_segments`.
        start_index: position of the first token (for cached decoding).
    Returns:
        `(batch, seq_len, embedding_dim)`.
    Example:
        >>> emb = TokenAndPositionEmbedding(1000, 128, 64, mask_zero=True)
        >>> tuple(emb(ops.array([[4, 9, 0]])).shape)
        (1, 3, 64)
    """

    def __init__(
        self,
        vocabulary_size: int,
        sequence_length: int,
        embedding_dim: int,
        num_segments: int | None = None,
        position_encoding: str = "learned",
        mask_zero: bool = False,
        use_layer_norm: bool = False,
        layer_norm_epsilon: float = 1e-12,
        dropout: float = 0.0,
        embeddings_initializer: Initializer = "glorot_uniform",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if position_encoding not in POSITION_ENCODINGS:
            raise ValueError(
                f"`position_encoding` must be one of {POSITION_ENCODINGS}. "
                f"Received: position_encoding={position_encoding!r}"
            )
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"`dropout` must be in [0, 1). Received: dropout={dropout}")
        self.vocabulary_size = vocabulary_size
        self.sequence_length = sequence_length
        self.embedding_dim = embedding_dim
        self.num_segments = num_segments
        self.position_encoding = position_encoding
        self.mask_zero = mask_zero
        self.use_layer_norm = use_layer_norm
        self.layer_norm_epsilon = layer_norm_epsilon
        self.dropout = dropout
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)
        policy = self.dtype_policy
        self.token_embedding = TokenEmbedding(
            vocabulary_size,
            embedding_dim,
            mask_zero=mask_zero,
            embeddings_initializer=fresh(self.embeddings_initializer),
            dtype=policy,
            name="token_embedding",
        )
        if position_encoding == "sinusoidal" and (
            not isinstance(sequence_length, int) or sequence_length <= 0
        ):
            raise ValueError(
                "`sequence_length` must be a positive integer. "
                f"Received: sequence_length={sequence_length!r}"
            )
        self.position_embedding = position_encoding_layer(
            position_encoding,
            sequence_length,
            "position_embedding",
            initializer=fresh(self.embeddings_initializer),
            dtype=policy,
        )
        self.segment_embedding = None
        if num_segments is not None:
            self.segment_embedding = SegmentEmbedding(
                num_segments,
                embedding_dim,
                fresh(self.embeddings_initializer),
                dtype=policy,
                name="segment_embedding",
            )
        self.layer_norm = None
        if use_layer_norm:
            self.layer_norm = keras.layers.LayerNormalization(
                epsilon=layer_norm_epsilon, dtype=policy, name="embeddings_layer_norm"
            )
        self.dropout_layer = keras.layers.Dropout(dropout, dtype=policy)

    def build(self, token_ids_shape: Shape, segment_ids_shape: Shape | None = None) -> None:
        if len(token_ids_shape) != 2:
            raise ValueError(
                "`token_ids` must have shape (batch, seq_len). "
                f"Received: token_ids.shape={tuple(token_ids_shape)}"
            )
        if token_ids_shape[1] is not None and token_ids_shape[1] > self.sequence_length:
            raise ValueError(
                f"`token_ids` may be at most sequence_length={self.sequence_length} long. "
                f"Received: token_ids.shape={tuple(token_ids_shape)}"
            )
        self.token_embedding.build(token_ids_shape)
        hidden_shape = (*token_ids_shape, self.embedding_dim)
        self.position_embedding.build(hidden_shape)
        if self.segment_embedding is not None:
            self.segment_embedding.build(token_ids_shape)
        if self.layer_norm is not None:
            self.layer_norm.build(hidden_shape)

    def call(
        self,
        token_ids: Tensor,
        segment_ids: Tensor | None = None,
        start_index: int | Tensor = 0,
        training: bool | None = None,
    ) -> Tensor:
        if segment_ids is not None and self.segment_embedding is None:
            raise ValueError(
                "`segment_ids` were given but the layer has no segment embedding; "
                "construct it with `num_segments`. Received: num_segments=None"
            )
        x = self.token_embedding(token_ids)
        x = x + self.position_embedding(x, start_index=start_index)
        if self.segment_embedding is not None:
            if segment_ids is None:
                segment_ids = ops.zeros_like(token_ids)
            x = x + self.segment_embedding(segment_ids)
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        return self.dropout_layer(x, training=training)

    def compute_mask(self, token_ids: Tensor, mask: Tensor | None = None) -> Tensor | None:
        if not self.mask_zero:
            return None
        return ops.not_equal(token_ids, 0)

    def compute_output_shape(
        self, token_ids_shape: Shape, segment_ids_shape: Shape | None = None
    ) -> Shape:
        return (*token_ids_shape, self.embedding_dim)

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "vocabulary_size": self.vocabulary_size,
            "sequence_length": self.sequence_length,
            "embedding_dim": self.embedding_dim,
            "num_segments": self.num_segments,
            "position_encoding": self.position_encoding,
            "mask_zero": self.mask_zero,
            "use_layer_norm": self.use_layer_norm,
            "layer_norm_epsilon": self.layer_norm_epsilon,
            "dropout": self.dropout,
            "embeddings_initializer": keras.initializers.serialize(self.embeddings_initializer),
        }
