"""The encoder-decoder backbone (Vaswani et al.) and the options of the pretrained
sequence-to-sequence families (BART, Marian, T5) as its arguments."""

import math
from typing import Any

import keras
from keras import ops

from keras_attn.checks import (
    check_choice,
    check_non_negative_ints,
    check_positive_ints,
    check_rate,
    check_renamed,
)
from keras_attn.layers.embeddings import SinusoidalPositionEncoding, TokenEmbedding
from keras_attn.layers.masks import per_row, row_positions
from keras_attn.layers.relative_position_bias import RelativePositionBias
from keras_attn.layers.token_and_position_embedding import (
    POSITION_ENCODINGS,
    position_encoding_layer,
)
from keras_attn.layers.transformer_block import NORMALIZATIONS, normalization_layer
from keras_attn.layers.transformer_decoder import TransformerDecoder
from keras_attn.layers.transformer_encoder import TransformerEncoder
from keras_attn.models.backbone import Backbone
from keras_attn.pretrained.registry import register_model_class
from keras_attn.types import Tensor

# "sinusoidal_halves": sines then cosines (Marian); "relative": no position vectors, a
# `RelativePositionBias` added to the self-attention scores instead (T5).
SEQ2SEQ_POSITIONS = (*POSITION_ENCODINGS, "sinusoidal_halves", "relative")


class Side:
    """One side's input path (a plain holder, not a layer): token embedding, optional scale,
    positions, embedding norm and dropout, and T5's relative position bias."""

    def __init__(self, backbone_args: dict[str, Any], side: str, table: TokenEmbedding) -> None:
        args = backbone_args
        self.table, self.pad_token_id = table, args["pad_token_id"]
        self.scale = None
        if args["scale_embedding"]:  # a layer: `KerasTensor * float` comes out marked sparse
            self.scale = keras.layers.Rescaling(
                math.sqrt(args["hidden_dim"]), name=f"{side}_embedding_scale"
            )
        self.offset = args["position_offset"]
        kind = args["position_encoding"]
        self.positions: keras.layers.Layer | None = None
        self.relative_bias: RelativePositionBias | None = None
        if kind == "relative":
            self.relative_bias = RelativePositionBias(
                args["num_heads"], args["relative_attention_num_buckets"],
                args["relative_attention_max_distance"], bidirectional=side == "encoder",
                name=f"{side}_relative_position_bias",
            )  # fmt: skip
        elif kind == "sinusoidal_halves":
            self.positions = SinusoidalPositionEncoding(layout="halves", name=f"{side}_positions")
        else:
            rows = args["max_sequence_length"]
            self.positions = position_encoding_layer(
                kind, None if rows is None else rows + self.offset, f"{side}_positions"
            )
        self.norm = None
        if args["embedding_layer_norm"]:
            self.norm = keras.layers.LayerNormalization(
                epsilon=args["layer_norm_epsilon"], name=f"{side}_embeddings_layer_norm"
            )
        self.dropout = keras.layers.Dropout(args["dropout"], name=f"{side}_embeddings_dropout")

    def embed(self, ids: Tensor, start_index: int | Tensor = 0, training: Any = None) -> Tensor:
        x = self.table(ids)
        if self.scale is not None:
            x = self.scale(x)
        if self.positions is not None:
            start = start_index + self.offset if self.offset else start_index
            if per_row(start):  # one position per row: the tables' own `position_ids` path
                x = x + self.positions(x, position_ids=row_positions(ops.shape(ids)[1], start))
            else:
                x = x + self.positions(x, start_index=start)
        if self.norm is not None:
            x = self.norm(x)
        return self.dropout(x, training=training)

    def score_bias(
        self, x: Tensor, key_length: Any = None, start_index: int | Tensor = 0
    ) -> dict[str, Tensor]:
        """`{"score_bias": …}` for the blocks of this side, or `{}`."""
        if self.relative_bias is None:
            return {}
        bias = self.relative_bias(x, key_length=key_length, start_index=start_index)
        return {"score_bias": bias}

    def padding(self, ids: Tensor) -> Tensor:
        return ops.not_equal(ids, self.pad_token_id)


@keras.saving.register_keras_serializable(package="keras_attn")
class Seq2SeqBackbone(Backbone):
    """Transformer encoder-decoder stack: source ids → encoder; target ids → decoder with
    cross-attention over the encoder outputs → decoder hidden states (the backbone of
    `Seq2SeqLM`).

    Inputs are a dict: `encoder_token_ids (batch, S)` and `decoder_token_ids (batch, T)`, int32;
    source ids equal to `pad_token_id` are padding. Training uses teacher forcing: the decoder
    reads the target shifted right (`[start, y1, ..., y_{T-1}]`) and `Seq2SeqLM` predicts
    `[y1, ..., y_T]`. Source and target share one embedding table when
    `target_vocabulary_size` is None (one vocabulary), else each side has its own;
    `token_embedding` is the target side's.

    The pretrained families are configurations of it (`from_pretrained` reads them):
    - BART: post-norm, GELU, learned positions from `position_offset=2`,
      `embedding_layer_norm=True`, `output_bias=True`;
    - Marian: post-norm, swish, `position_encoding="sinusoidal_halves"`,
      `scale_embedding=True`, `output_bias=True`;
    - T5: pre-norm RMSNorm, `score="dot"` (no 1/√d), `position_encoding="relative"`, no
      biases; v1.0 ReLU with a tied head scaled by `logit_scale=hidden_dim**-0.5`, v1.1 gated
      GELU with an untied head.

    Args:
        vocabulary_size: int. Source vocabulary (and target, when shared).
        max_sequence_length: int. Longest source or target (learned position tables; with
            `position_offset`, the table has `max_sequence_length + position_offset` rows).
        target_vocabulary_size: optional int. A separate target vocabulary.
        hidden_dim: int. Defaults to `128`.
        num_encoder_layers, num_decoder_layers: ints. Default to `2`.
        num_heads: int. Defaults to `4`.
        intermediate_dim: int. Defaults to `4 * hidden_dim`.
        dropout: float. Defaults to `0.1`.
        activation: Defaults to `"relu"` (Vaswani).
        normalize_first: bool. Pre-norm blocks plus final norms. Defaults to `False`.
        position_encoding: `"sinusoidal"` (Vaswani; the default), `"learned"`,
            `"sinusoidal_halves"` or `"relative"` (see above).
        pad_token_id: int. Padding id of the source (and, with `mask_decoder_padding`, the
            target). Defaults to `0`.
        mask_decoder_padding: bool. The decoder masks target ids equal to `pad_token_id` as
            keys. `False` (the pretrained families, whose decoder start id may be the padding
            id) masks causally only. Defaults to `True`.
        suppress_padding: bool. Generation never writes `pad_token_id` even where the decoder
            does not mask it (Marian's `bad_words_ids=[[pad]]`). Defaults to `False`.
        position_offset: int. Row of the learned table where position 0 is (BART: 2).
        scale_embedding: bool. Token embeddings times √hidden_dim. Defaults to `False`.
        embedding_layer_norm: bool. LayerNorm after token + position. Defaults to `False`.
        layer_norm_epsilon: float. Defaults to `1e-5`.
        normalization: `"layer_norm"` or `"rms_norm"` (T5's scale-only norm).
        gated_feed_forward: bool. `act(W_g x) ⊙ W_1 x` feed-forward. Defaults to `False`.
        attention_bias, feed_forward_bias: bool. Biases of the projections. Default `True`.
        score: attention score of every block (`"scaled_dot"`, T5's `"dot"`, …).
        relative_attention_num_buckets, relative_attention_max_distance: ints, for
            `position_encoding="relative"`. Default to `32` and `128`.
        tie_word_embeddings: bool. The output projection is the target embedding
            transposed; `False` gives it its own matrix. Defaults to `True`.
        logit_scale: float. The decoder output is multiplied by it before the projection.
            Defaults to `1.0`.
        output_bias: bool. A bias on the output logits (`final_logits_bias`).
        decoder_start_token_id: optional int: the first decoder input of generation.
        forced_eos_token_id: optional int: the only id the last step of a generation may
            choose (BART's and Marian's checkpoints: their end id; `transformers`' rule).
        forced_bos_token_id: optional int: the only id the first step of a generation may
            choose (`bart-large-cnn`: 0).
        head_dim: optional int. Width of each head; defaults to `hidden_dim // num_heads` (T5's
            `d_kv` may differ).
    Returns:
        decoder hidden states `(batch, T, hidden_dim)` (after the final norm, when pre-norm).
    """

    config_args = (
        "vocabulary_size", "max_sequence_length", "target_vocabulary_size", "hidden_dim",
        "num_encoder_layers", "num_decoder_layers", "num_heads", "intermediate_dim", "dropout",
        "activation", "normalize_first", "position_encoding", "pad_token_id",
        "mask_decoder_padding", "suppress_padding", "position_offset", "scale_embedding",
        "embedding_layer_norm", "layer_norm_epsilon", "normalization", "gated_feed_forward",
        "attention_bias", "feed_forward_bias", "score", "relative_attention_num_buckets",
        "relative_attention_max_distance", "tie_word_embeddings", "logit_scale",
        "output_bias", "decoder_start_token_id", "head_dim", "forced_eos_token_id",
        "forced_bos_token_id",
    )  # fmt: skip

    def __init__(
        self,
        vocabulary_size: int,
        max_sequence_length: int | None = None,
        target_vocabulary_size: int | None = None,
        hidden_dim: int = 128,
        num_encoder_layers: int = 2,
        num_decoder_layers: int = 2,
        num_heads: int = 4,
        intermediate_dim: int | None = None,
        dropout: float = 0.1,
        activation: str = "relu",
        normalize_first: bool = False,
        position_encoding: str = "sinusoidal",
        pad_token_id: int = 0,
        mask_decoder_padding: bool = True,
        suppress_padding: bool = False,
        position_offset: int = 0,
        scale_embedding: bool = False,
        embedding_layer_norm: bool = False,
        layer_norm_epsilon: float = 1e-5,
        normalization: str = "layer_norm",
        gated_feed_forward: bool = False,
        attention_bias: bool = True,
        feed_forward_bias: bool = True,
        score: str = "scaled_dot",
        relative_attention_num_buckets: int = 32,
        relative_attention_max_distance: int = 128,
        tie_word_embeddings: bool = True,
        logit_scale: float = 1.0,
        output_bias: bool = False,
        decoder_start_token_id: int | None = None,
        head_dim: int | None = None,
        forced_eos_token_id: int | None = None,
        forced_bos_token_id: int | None = None,
        name: str = "seq2seq_backbone",
        **kwargs: Any,
    ) -> None:
        check_renamed(kwargs, ("sequence_length",))
        check_positive_ints(
            vocabulary_size=vocabulary_size,
            hidden_dim=hidden_dim,
            num_encoder_layers=num_encoder_layers,
            num_decoder_layers=num_decoder_layers,
            num_heads=num_heads,
        )
        if position_encoding == "learned" or max_sequence_length is not None:
            check_positive_ints(max_sequence_length=max_sequence_length)
        if target_vocabulary_size is not None:
            check_positive_ints(target_vocabulary_size=target_vocabulary_size)
        check_rate("dropout", dropout)
        check_choice("position_encoding", position_encoding, SEQ2SEQ_POSITIONS)
        check_choice("normalization", normalization, NORMALIZATIONS)
        check_non_negative_ints(pad_token_id=pad_token_id, position_offset=position_offset)
        if decoder_start_token_id is not None:
            check_non_negative_ints(decoder_start_token_id=decoder_start_token_id)
        forced = {"forced_eos_token_id": forced_eos_token_id,
                  "forced_bos_token_id": forced_bos_token_id}  # fmt: skip
        for key, value in forced.items():
            if value is None:
                continue
            check_non_negative_ints(**{key: value})
            if value >= (target_vocabulary_size or vocabulary_size):
                raise ValueError(
                    f"`{key}` must be an id of the target vocabulary. Received: "
                    f"{key}={value}, vocabulary size {target_vocabulary_size or vocabulary_size}"
                )
        if head_dim is not None:
            check_positive_ints(head_dim=head_dim)
        if not isinstance(logit_scale, int | float) or not logit_scale > 0:
            raise ValueError(
                f"`logit_scale` must be positive. Received: logit_scale={logit_scale!r}"
            )
        args = dict(locals())
        block_args: dict[str, Any] = {
            "num_heads": num_heads,
            "intermediate_dim": intermediate_dim or 4 * hidden_dim,
            "dropout": dropout,
            "activation": activation,
            "normalize_first": normalize_first,
            "layer_norm_epsilon": layer_norm_epsilon,
            "normalization": normalization,
            "gated_feed_forward": gated_feed_forward,
            "attention_bias": attention_bias,
            "feed_forward_bias": feed_forward_bias,
            "score": score,
            "key_dim": head_dim,
        }
        source_ids = keras.Input((None,), dtype="int32", name="encoder_token_ids")
        target_ids = keras.Input((None,), dtype="int32", name="decoder_token_ids")
        # Id 0 as padding travels by Keras mask propagation (to the loss, too); any other
        # rule hands each block its mask.
        mask_zero = pad_token_id == 0 and mask_decoder_padding
        shared = target_vocabulary_size is None
        source_table = TokenEmbedding(
            vocabulary_size, hidden_dim, mask_zero=mask_zero, name="encoder_token_embedding",
            tie_weights=tie_word_embeddings or not shared, reverse_bias=output_bias and shared,
        )  # fmt: skip
        target_table = source_table
        if not shared:
            target_table = TokenEmbedding(
                target_vocabulary_size, hidden_dim, mask_zero=mask_zero,  # type: ignore[arg-type]
                name="decoder_token_embedding", tie_weights=tie_word_embeddings,
                reverse_bias=output_bias,
            )  # fmt: skip
        encoder_side = Side(args, "encoder", source_table)
        decoder_side = Side(args, "decoder", target_table)

        def final_norm(side: str) -> keras.layers.Layer | None:
            if not normalize_first:
                return None
            return normalization_layer(normalization, layer_norm_epsilon, f"{side}_final_norm")

        encoder_blocks = [TransformerEncoder(**block_args, name=f"encoder_block_{i}")
                          for i in range(num_encoder_layers)]  # fmt: skip
        decoder_blocks = [TransformerDecoder(**block_args, name=f"decoder_block_{i}")
                          for i in range(num_decoder_layers)]  # fmt: skip
        encoder_norm, decoder_norm = final_norm("encoder"), final_norm("decoder")
        source_mask = encoder_side.padding(source_ids)
        x = encoder_side.embed(source_ids)
        bias = encoder_side.score_bias(x)
        for block in encoder_blocks:
            x = block(x, padding_mask=source_mask, **bias)
        encoded = encoder_norm(x) if encoder_norm is not None else x
        y = decoder_side.embed(target_ids)
        bias = decoder_side.score_bias(y)
        masks: dict[str, Tensor] = {"encoder_padding_mask": source_mask}
        if mask_decoder_padding:
            masks["decoder_padding_mask"] = decoder_side.padding(target_ids)
        for block in decoder_blocks:
            y = block(y, encoded, **masks, **bias)
        if decoder_norm is not None:
            y = decoder_norm(y)
        inputs = {"encoder_token_ids": source_ids, "decoder_token_ids": target_ids}
        super().__init__(inputs, y, name=name, **kwargs)
        self._set_config_args(locals())
        # What `Seq2SeqLM`'s `encode`, `call_with_cache` and `call_with_attention_scores` run.
        self.encoder_token_embedding, self.decoder_token_embedding = source_table, target_table
        self.encoder_side, self.decoder_side = encoder_side, decoder_side
        self.encoder_position_embedding = encoder_side.positions
        self.decoder_position_embedding = decoder_side.positions
        self.encoder_blocks, self.decoder_blocks = encoder_blocks, decoder_blocks
        self.encoder_final_norm, self.decoder_final_norm = encoder_norm, decoder_norm
        self.output_scale = None
        if logit_scale != 1.0:
            self.output_scale = keras.layers.Rescaling(logit_scale, name="output_scale")

    @property
    def token_embedding(self) -> TokenEmbedding:
        """The target side's `TokenEmbedding` (the output projection ties to it)."""
        return self.decoder_token_embedding

    def logits(self, hidden: Tensor) -> Tensor:
        """Vocabulary logits of decoder hidden states (after the final norm): the scale, then
        the output projection (with its bias, if any)."""
        if self.output_scale is not None:
            hidden = self.output_scale(hidden)
        return self.decoder_token_embedding(hidden, reverse=True)


register_model_class("Seq2SeqBackbone", Seq2SeqBackbone)
