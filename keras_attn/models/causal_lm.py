"""GPT-style causal language model: embeddings, decoder blocks, output tied to the embedding."""

import keras

from keras_attn.layers.embeddings import (
    PositionEmbedding,
    SinusoidalPositionEncoding,
    TokenEmbedding,
)
from keras_attn.layers.transformer_decoder import TransformerDecoder


def build_causal_lm(
    vocabulary_size,
    sequence_length,
    hidden_dim=128,
    num_layers=2,
    num_heads=4,
    intermediate_dim=None,
    dropout=0.0,
    normalize_first=True,
    activation="gelu",
    position_encoding="learned",
    name="causal_lm",
):
    """Builds a causal LM: `token_ids (batch, seq) int32 -> logits (batch, seq, vocab)`.

    Token id 0 is padding: `mask_zero=True` creates the padding mask, which reaches every
    block by Keras mask propagation and masks padded positions out of the loss. The output
    projection is the token embedding transposed (tied weights), as in GPT-2. Logits are float32
    under mixed precision.

    Args:
        vocabulary_size: int. Number of token ids.
        sequence_length: int. Longest input (size of the learned position table).
        hidden_dim: int. Model width. num_layers: int. Decoder blocks. num_heads: int.
        intermediate_dim: int. Feed-forward width; defaults to `4 * hidden_dim`.
        dropout: float. Dropout in embeddings and blocks.
        normalize_first: bool. Pre-norm blocks plus a final LayerNorm (GPT-2), or post-norm.
        activation: feed-forward activation.
        position_encoding: `"learned"` or `"sinusoidal"`.
    Returns:
        a functional `keras.Model` with input `token_ids` and output `logits`.
    """
    if position_encoding not in ("learned", "sinusoidal"):
        raise ValueError(
            "`position_encoding` must be 'learned' or 'sinusoidal'. "
            f"Received: position_encoding={position_encoding!r}"
        )
    token_ids = keras.Input((None,), dtype="int32", name="token_ids")
    token_embedding = TokenEmbedding(
        vocabulary_size, hidden_dim, mask_zero=True, name="token_embedding"
    )
    x = token_embedding(token_ids)
    if position_encoding == "learned":
        positions = PositionEmbedding(sequence_length, name="position_embedding")(x)
    else:
        positions = SinusoidalPositionEncoding(name="position_embedding")(x)
    x = keras.layers.Add(name="embeddings_add")([x, positions])
    x = keras.layers.Dropout(dropout, name="embeddings_dropout")(x)
    for i in range(num_layers):
        x = TransformerDecoder(
            num_heads=num_heads,
            intermediate_dim=intermediate_dim or 4 * hidden_dim,
            dropout=dropout,
            activation=activation,
            normalize_first=normalize_first,
            name=f"decoder_block_{i}",
        )(x)
    if normalize_first:
        x = keras.layers.LayerNormalization(epsilon=1e-5, name="final_layer_norm")(x)
    logits = token_embedding(x, reverse=True)
    logits = keras.layers.Activation("linear", dtype="float32", name="logits")(logits)
    return keras.Model(token_ids, logits, name=name)


def lm_loss(pad_id=0):
    """Next-token cross-entropy over logits, ignoring targets equal to `pad_id`."""
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=pad_id)
