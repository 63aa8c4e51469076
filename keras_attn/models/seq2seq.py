"""Encoder-decoder Transformer (Vaswani et al.), trained with teacher forcing."""

import keras

from keras_attn.checks import check_choice, check_positive_ints, check_rate
from keras_attn.layers.embeddings import TokenEmbedding
from keras_attn.layers.token_and_position_embedding import (
    POSITION_ENCODINGS,
    position_encoding_layer,
)
from keras_attn.layers.transformer_decoder import TransformerDecoder
from keras_attn.layers.transformer_encoder import TransformerEncoder
from keras_attn.models.causal_lm import lm_loss
from keras_attn.models.task import Task, float32_logits


@keras.saving.register_keras_serializable(package="keras_attn")
class Seq2Seq(Task):
    """Transformer encoder-decoder: source ids → encoder; target ids → decoder with
    cross-attention over the encoder outputs → next-token logits.

    Inputs are a dict: `encoder_token_ids (batch, S)` and `decoder_token_ids (batch, T)`, int32,
    id 0 = padding on both sides. Training uses teacher forcing: the decoder reads the target
    shifted right (`[start, y1, ..., y_{T-1}]`) and predicts `[y1, ..., y_T]`. The output
    projection is the target embedding transposed. Source and target share one embedding
    table when `target_vocabulary_size` is None (one vocabulary), else each side has its own.

    Args:
        vocabulary_size: int. Source vocabulary (and target, when shared).
        sequence_length: int. Longest source or target (learned position tables).
        target_vocabulary_size: optional int. A separate target vocabulary.
        hidden_dim: int. Defaults to `128`.
        num_encoder_layers, num_decoder_layers: ints. Default to `2`.
        num_heads: int. Defaults to `4`.
        intermediate_dim: int. Defaults to `4 * hidden_dim`.
        dropout: float. Defaults to `0.1`.
        activation: Defaults to `"relu"` (Vaswani).
        normalize_first: bool. Pre-norm blocks plus final LayerNorms. Defaults to `False`.
        position_encoding: `"sinusoidal"` (Vaswani; the default) or `"learned"`.
    Returns:
        logits `(batch, T, target vocabulary)`, float32.
    """

    config_args = (
        "vocabulary_size", "sequence_length", "target_vocabulary_size", "hidden_dim",
        "num_encoder_layers", "num_decoder_layers", "num_heads", "intermediate_dim", "dropout",
        "activation", "normalize_first", "position_encoding",
    )  # fmt: skip

    def __init__(
        self,
        vocabulary_size,
        sequence_length,
        target_vocabulary_size=None,
        hidden_dim=128,
        num_encoder_layers=2,
        num_decoder_layers=2,
        num_heads=4,
        intermediate_dim=None,
        dropout=0.1,
        activation="relu",
        normalize_first=False,
        position_encoding="sinusoidal",
        name="seq2seq",
        **kwargs,
    ):
        check_positive_ints(
            vocabulary_size=vocabulary_size,
            sequence_length=sequence_length,
            hidden_dim=hidden_dim,
            num_encoder_layers=num_encoder_layers,
            num_decoder_layers=num_decoder_layers,
            num_heads=num_heads,
        )
        if target_vocabulary_size is not None:
            check_positive_ints(target_vocabulary_size=target_vocabulary_size)
        check_rate("dropout", dropout)
        check_choice("position_encoding", position_encoding, POSITION_ENCODINGS)
        block_args = {
            "num_heads": num_heads,
            "intermediate_dim": intermediate_dim or 4 * hidden_dim,
            "dropout": dropout,
            "activation": activation,
            "normalize_first": normalize_first,
        }
        source_ids = keras.Input((None,), dtype="int32", name="encoder_token_ids")
        target_ids = keras.Input((None,), dtype="int32", name="decoder_token_ids")
        source_embedding = TokenEmbedding(
            vocabulary_size, hidden_dim, mask_zero=True, name="encoder_token_embedding"
        )
        target_embedding = source_embedding
        if target_vocabulary_size is not None:
            target_embedding = TokenEmbedding(
                target_vocabulary_size, hidden_dim, mask_zero=True, name="decoder_token_embedding"
            )

        def embed(ids, table, side):
            x = table(ids)
            positions = position_encoding_layer(
                position_encoding, sequence_length, f"{side}_positions"
            )
            x = keras.layers.Add(name=f"{side}_embeddings_add")([x, positions(x)])
            return keras.layers.Dropout(dropout, name=f"{side}_embeddings_dropout")(x)

        x = embed(source_ids, source_embedding, "encoder")
        for i in range(num_encoder_layers):
            x = TransformerEncoder(**block_args, name=f"encoder_block_{i}")(x)
        if normalize_first:
            x = keras.layers.LayerNormalization(epsilon=1e-5, name="encoder_final_norm")(x)
        encoded = x
        y = embed(target_ids, target_embedding, "decoder")
        for i in range(num_decoder_layers):
            y = TransformerDecoder(**block_args, name=f"decoder_block_{i}")(y, encoded)
        if normalize_first:
            y = keras.layers.LayerNormalization(epsilon=1e-5, name="decoder_final_norm")(y)
        logits = float32_logits(target_embedding(y, reverse=True), "logits")
        inputs = {"encoder_token_ids": source_ids, "decoder_token_ids": target_ids}
        super().__init__(inputs, logits, name=name, **kwargs)
        self._set_config_args(locals())

    def default_loss(self):
        return lm_loss()

    def generate(self, source_ids, max_new_tokens, start_id, **kwargs):
        """Decodes a target for each source id list, starting from `start_id`.

        Keyword arguments as `CausalLM.generate` (`sampler`, `num_beams`, `stop_token_ids`,
        ...). Returns a list with the generated target ids of each source (without the start
        id, and without the stop id that ended it).
        """
        from keras_attn.decoding import Seq2SeqRunner, generate

        runner = Seq2SeqRunner(self, source_ids)
        prompts = [[start_id] for _ in source_ids]
        return generate(runner, prompts, max_new_tokens, **kwargs)
