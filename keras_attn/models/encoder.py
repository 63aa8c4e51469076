"""BERT-style encoder: token + position + segment embeddings, then Transformer encoder blocks."""

import keras

from keras_attn.checks import check_choice, check_positive_ints, check_rate
from keras_attn.layers.token_and_position_embedding import (
    POSITION_ENCODINGS,
    TokenAndPositionEmbedding,
)
from keras_attn.layers.transformer_encoder import TransformerEncoder
from keras_attn.models.task import Task


@keras.saving.register_keras_serializable(package="keras_attn")
class Encoder(Task):
    """BERT-style encoder, the backbone the task heads sit on.

    Inputs are a dict: `token_ids (batch, seq)` int32, id 0 = padding, and with
    `num_segments`, `segment_ids (batch, seq)`. The padding mask comes from the token ids
    (`mask_zero`) and reaches every block by mask propagation. Outputs are a dict:
    `sequence_output (batch, seq, hidden_dim)`, and `pooled_output (batch, hidden_dim)`, the
    first ([CLS]) position through a tanh Dense layer, as BERT's pooler.

    Args:
        vocabulary_size: int.
        max_sequence_length: int. Size of the learned position table. Defaults to `128`.
        hidden_dim: int. Defaults to `128`.
        num_layers: int. Defaults to `2`.
        num_heads: int. Defaults to `4`.
        intermediate_dim: int. Feed-forward width; defaults to `4 * hidden_dim`.
        dropout: float. Defaults to `0.1`.
        num_segments: int or None. Segment (sentence A/B) embeddings. Defaults to `2`.
        activation: feed-forward activation. Defaults to `"gelu"`.
        normalize_first: bool. Pre-norm blocks plus a final LayerNorm; BERT is post-norm
            (the default).
        layer_norm_epsilon: float. Defaults to `1e-12` (BERT's).
        position_encoding: `"learned"` (BERT) or `"sinusoidal"`.
    Example:
        >>> encoder = Encoder(vocabulary_size=1000, hidden_dim=64)
        >>> encoder({"token_ids": ids, "segment_ids": segments})["pooled_output"].shape
        (batch, 64)
    """

    config_args = (
        "vocabulary_size", "max_sequence_length", "hidden_dim", "num_layers", "num_heads",
        "intermediate_dim", "dropout", "num_segments", "activation", "normalize_first",
        "layer_norm_epsilon", "position_encoding",
    )  # fmt: skip

    def __init__(
        self,
        vocabulary_size,
        max_sequence_length=128,
        hidden_dim=128,
        num_layers=2,
        num_heads=4,
        intermediate_dim=None,
        dropout=0.1,
        num_segments=2,
        activation="gelu",
        normalize_first=False,
        layer_norm_epsilon=1e-12,
        position_encoding="learned",
        name="encoder",
        **kwargs,
    ):
        check_positive_ints(
            vocabulary_size=vocabulary_size,
            max_sequence_length=max_sequence_length,
            hidden_dim=hidden_dim,
            num_layers=num_layers,
            num_heads=num_heads,
        )
        if num_segments is not None:
            check_positive_ints(num_segments=num_segments)
        check_rate("dropout", dropout)
        check_choice("position_encoding", position_encoding, POSITION_ENCODINGS)
        token_ids = keras.Input((None,), dtype="int32", name="token_ids")
        inputs = {"token_ids": token_ids}
        embeddings = TokenAndPositionEmbedding(
            vocabulary_size,
            max_sequence_length,
            hidden_dim,
            num_segments=num_segments,
            position_encoding=position_encoding,
            mask_zero=True,
            use_layer_norm=True,
            layer_norm_epsilon=layer_norm_epsilon,
            dropout=dropout,
            name="embeddings",
        )
        if num_segments:
            inputs["segment_ids"] = keras.Input((None,), dtype="int32", name="segment_ids")
            x = embeddings(token_ids, inputs["segment_ids"])
        else:
            x = embeddings(token_ids)
        for i in range(num_layers):
            x = TransformerEncoder(
                num_heads=num_heads,
                intermediate_dim=intermediate_dim or 4 * hidden_dim,
                dropout=dropout,
                activation=activation,
                normalize_first=normalize_first,
                layer_norm_epsilon=layer_norm_epsilon,
                name=f"encoder_block_{i}",
            )(x)
        if normalize_first:
            x = keras.layers.LayerNormalization(
                epsilon=layer_norm_epsilon, name="final_layer_norm"
            )(x)
        pooled = keras.layers.Dense(hidden_dim, activation="tanh", name="pooler")(x[:, 0])
        outputs = {"sequence_output": x, "pooled_output": pooled}
        super().__init__(inputs, outputs, name=name, **kwargs)
        self._set_config_args(locals())

    @property
    def token_embedding(self):
        """The `TokenEmbedding` layer (a masked-LM head ties its output projection to it)."""
        return self.get_layer("embeddings").token_embedding


def encoder_inputs(encoder, leading_shape=()):
    """Fresh `keras.Input`s matching `encoder`'s inputs, with extra leading axes (choices)."""
    return {
        name: keras.Input((*leading_shape, None), dtype="int32", name=name)
        for name in encoder.input
    }
