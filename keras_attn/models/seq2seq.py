"""Encoder-decoder Transformer (Vaswani et al.), trained with teacher forcing."""

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import keras
import numpy as np
from keras import ops

from keras_attn.checks import check_choice, check_positive_ints, check_rate, check_renamed
from keras_attn.layers.embeddings import TokenEmbedding
from keras_attn.layers.token_and_position_embedding import (
    POSITION_ENCODINGS,
    position_encoding_layer,
)
from keras_attn.layers.transformer_decoder import TransformerDecoder
from keras_attn.layers.transformer_encoder import TransformerEncoder
from keras_attn.losses import SparseCrossEntropy
from keras_attn.models.backbone import Backbone, HoldsBackbone
from keras_attn.models.cached import empty_caches
from keras_attn.models.causal_lm import backbone_of, fresh_inputs, lm_loss
from keras_attn.models.task import Task, float32_logits
from keras_attn.types import Tensor

if TYPE_CHECKING:
    from keras_attn.decoding import Runner


@keras.saving.register_keras_serializable(package="keras_attn")
class Seq2SeqBackbone(Backbone):
    """Transformer encoder-decoder stack: source ids → encoder; target ids → decoder with
    cross-attention over the encoder outputs → decoder hidden states (the backbone of
    `Seq2SeqLM`).

    Inputs are a dict: `encoder_token_ids (batch, S)` and `decoder_token_ids (batch, T)`, int32,
    id 0 = padding on both sides. Training uses teacher forcing: the decoder reads the target
    shifted right (`[start, y1, ..., y_{T-1}]`) and `Seq2SeqLM` predicts `[y1, ..., y_T]`.
    Source and target share one embedding table when `target_vocabulary_size` is None (one
    vocabulary), else each side has its own; `token_embedding` is the target side's.

    Args:
        vocabulary_size: int. Source vocabulary (and target, when shared).
        max_sequence_length: int. Longest source or target (learned position tables).
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
        decoder hidden states `(batch, T, hidden_dim)` (after the final norm, when pre-norm).
    """

    config_args = (
        "vocabulary_size", "max_sequence_length", "target_vocabulary_size", "hidden_dim",
        "num_encoder_layers", "num_decoder_layers", "num_heads", "intermediate_dim", "dropout",
        "activation", "normalize_first", "position_encoding",
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
        name: str = "seq2seq_backbone",
        **kwargs: Any,
    ) -> None:
        check_renamed(kwargs, ("sequence_length",))
        check_positive_ints(
            vocabulary_size=vocabulary_size,
            max_sequence_length=max_sequence_length,
            hidden_dim=hidden_dim,
            num_encoder_layers=num_encoder_layers,
            num_decoder_layers=num_decoder_layers,
            num_heads=num_heads,
        )
        if target_vocabulary_size is not None:
            check_positive_ints(target_vocabulary_size=target_vocabulary_size)
        check_rate("dropout", dropout)
        check_choice("position_encoding", position_encoding, POSITION_ENCODINGS)
        block_args: dict[str, Any] = {
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

        def positions(side: str) -> keras.layers.Layer:
            return position_encoding_layer(
                position_encoding,
                max_sequence_length,  # type: ignore[arg-type]  # None: sinusoidal (layers/ annotates it `int`)
                f"{side}_positions",
            )

        def embed(
            ids: Tensor, table: TokenEmbedding, position_layer: keras.layers.Layer, side: str
        ) -> Tensor:
            x = table(ids)
            x = keras.layers.Add(name=f"{side}_embeddings_add")([x, position_layer(x)])
            return keras.layers.Dropout(dropout, name=f"{side}_embeddings_dropout")(x)

        def final_norm(side: str) -> keras.layers.LayerNormalization | None:
            if not normalize_first:
                return None
            return keras.layers.LayerNormalization(epsilon=1e-5, name=f"{side}_final_norm")

        source_positions, target_positions = positions("encoder"), positions("decoder")
        encoder_blocks = [TransformerEncoder(**block_args, name=f"encoder_block_{i}")
                          for i in range(num_encoder_layers)]  # fmt: skip
        decoder_blocks = [TransformerDecoder(**block_args, name=f"decoder_block_{i}")
                          for i in range(num_decoder_layers)]  # fmt: skip
        encoder_norm, decoder_norm = final_norm("encoder"), final_norm("decoder")
        x = embed(source_ids, source_embedding, source_positions, "encoder")
        for block in encoder_blocks:
            x = block(x)
        encoded = encoder_norm(x) if encoder_norm is not None else x
        y = embed(target_ids, target_embedding, target_positions, "decoder")
        for block in decoder_blocks:
            y = block(y, encoded)
        if decoder_norm is not None:
            y = decoder_norm(y)
        inputs = {"encoder_token_ids": source_ids, "decoder_token_ids": target_ids}
        super().__init__(inputs, y, name=name, **kwargs)
        self._set_config_args(locals())
        # What `Seq2SeqLM`'s `encode`, `call_with_cache` and `call_with_attention_scores` run.
        self.encoder_token_embedding, self.decoder_token_embedding = (
            source_embedding,
            target_embedding,
        )
        self.encoder_position_embedding = source_positions
        self.decoder_position_embedding = target_positions
        self.encoder_blocks, self.decoder_blocks = encoder_blocks, decoder_blocks
        self.encoder_final_norm, self.decoder_final_norm = encoder_norm, decoder_norm

    @property
    def token_embedding(self) -> TokenEmbedding:
        """The target side's `TokenEmbedding` (the output projection ties to it)."""
        return self.decoder_token_embedding


@keras.saving.register_keras_serializable(package="keras_attn")
class Seq2SeqLM(HoldsBackbone, Task):
    """Sequence-to-sequence LM: a `Seq2SeqBackbone`, then the target embedding transposed:
    `{"encoder_token_ids", "decoder_token_ids"}` → logits `(batch, T, target vocabulary)`,
    float32 (`Seq2Seq` for short).

    `Seq2SeqLM(backbone)` wraps a backbone; `Seq2SeqLM(vocabulary_size, max_sequence_length,
    ...)` builds the `Seq2SeqBackbone` of those arguments first. The task answers its
    backbone's arguments (`model.hidden_dim`) and owns the cached decoding call.

    Args:
        backbone: a `Seq2SeqBackbone`, or its arguments in its place.
        preprocessor: optional preprocessor, saved with the task.
    """

    config_args = ("backbone",)
    nested_models = ("backbone",)

    def __init__(
        self,
        backbone: "Seq2SeqBackbone | int | None" = None,
        *args: Any,
        preprocessor: Any = None,
        name: str = "seq2seq",
        **kwargs: Any,
    ) -> None:
        trainable = {key: kwargs.pop(key) for key in ("trainable",) if key in kwargs}
        backbone = backbone_of(Seq2SeqBackbone, backbone, args, kwargs)
        inputs = fresh_inputs(backbone)
        y = backbone(inputs)
        logits = float32_logits(backbone.token_embedding(y, reverse=True), "logits")
        super().__init__(inputs, logits, name=name, preprocessor=preprocessor, **trainable)
        self.backbone = backbone

    def default_loss(self) -> SparseCrossEntropy:
        return lm_loss()

    @property
    def max_length(self) -> int | None:
        """The longest target the position table allows (None: sinusoidal)."""
        return getattr(self.decoder_position_embedding, "sequence_length", None)

    def encode(
        self, source_ids: Tensor, maps: dict[str, dict[str, Tensor]] | None = None
    ) -> Tensor:
        """The encoder's output `(batch, S, hidden)` for int ids `(batch, S)` (0 = padding);
        with a dict `maps`, each block's attention weights are written into it."""
        source_ids = ops.convert_to_tensor(source_ids, "int32")
        x = self.encoder_token_embedding(source_ids)
        x = x + self.encoder_position_embedding(x)
        mask = ops.not_equal(source_ids, 0)
        for block in self.encoder_blocks:
            if maps is None:
                x = block(x, padding_mask=mask)
            else:
                x, weights = block(x, padding_mask=mask, return_attention_scores=True)
                maps[block.name] = {"self": weights}
        return self.encoder_final_norm(x) if self.encoder_final_norm is not None else x

    def _embed_targets(self, token_ids, index=0):
        y = self.decoder_token_embedding(token_ids)
        return y + self.decoder_position_embedding(y, start_index=index)

    def _logits(self, y):
        if self.decoder_final_norm is not None:
            y = self.decoder_final_norm(y)
        return ops.cast(self.decoder_token_embedding(y, reverse=True), "float32")

    def init_cache(self, encoded: Tensor, source_ids: Tensor, max_length: int) -> dict[str, Any]:
        """The decoding state of rows whose sources are `source_ids` and encoder outputs
        `encoded`: an empty self-attention cache per block, each block's cross-attention keys
        and values (projected once), the source mask and ids."""
        caches = empty_caches(self.decoder_blocks, ops.shape(encoded)[0], max_length)
        source_ids = ops.convert_to_tensor(source_ids, "int32")
        return {
            "caches": caches,
            "cross_caches": [
                block.cross_attention.key_value_cache(encoded) for block in self.decoder_blocks
            ],
            "source_mask": ops.not_equal(source_ids, 0),
            "source_ids": source_ids,
        }

    def call_with_cache(
        self, token_ids: Tensor, cache: dict[str, Any], cache_update_index: int | Tensor
    ) -> tuple[Tensor, dict[str, Any]]:
        """Logits of target `token_ids` placed at `cache_update_index`, and the new state."""
        y = self._embed_targets(token_ids, cache_update_index)
        updated = []
        for block, self_cache, cross_cache in zip(
            self.decoder_blocks, cache["caches"], cache["cross_caches"], strict=True
        ):
            y, self_cache = block(
                y, self_attention_cache=self_cache,
                self_attention_cache_update_index=cache_update_index,
                cross_attention_cache=cross_cache, encoder_padding_mask=cache["source_mask"],
            )  # fmt: skip
            updated.append(self_cache)
        return self._logits(y), {**cache, "caches": updated}

    def call_with_attention_scores(
        self, inputs: dict[str, Tensor]
    ) -> tuple[Tensor, dict[str, dict[str, Tensor]]]:
        """`(logits, {block name: {"self": …[, "cross": …]}})`: every block's weights."""
        maps: dict = {}
        source = ops.convert_to_tensor(inputs["encoder_token_ids"], "int32")
        target = ops.convert_to_tensor(inputs["decoder_token_ids"], "int32")
        encoded = self.encode(source, maps)
        y = self._embed_targets(target)
        for block in self.decoder_blocks:
            y, self_weights, cross_weights = block(
                y, encoded, decoder_padding_mask=ops.not_equal(target, 0),
                encoder_padding_mask=ops.not_equal(source, 0), return_attention_scores=True,
            )  # fmt: skip
            maps[block.name] = {"self": self_weights, "cross": cross_weights}
        return self._logits(y), maps

    def runner(self, source_ids: Any) -> "Runner":
        """The decoding `Runner` of targets for `source_ids` (a list of id lists): the sources
        are encoded once, here."""
        from keras_attn.decoding import Runner, as_prompts

        sources = as_prompts(source_ids)
        padded = np.zeros((len(sources), max(len(s) for s in sources)), dtype="int32")
        for row, ids in enumerate(sources):
            padded[row, : len(ids)] = ids
        encoded = self.encode(padded)

        def initial_state(rows: Sequence[int] | np.ndarray, max_length: int) -> dict[str, Any]:
            rows = np.asarray(rows, dtype="int32")
            return self.init_cache(ops.take(encoded, rows, axis=0), padded[rows], max_length)

        def full(token_ids: Tensor, state: dict[str, Any]) -> Tensor:
            inputs = {"encoder_token_ids": state["source_ids"],
                      "decoder_token_ids": ops.convert_to_tensor(token_ids)}  # fmt: skip
            return self(inputs, training=False)

        return Runner(self, self.call_with_cache, full, initial_state,
                      self.decoder_token_embedding.vocabulary_size, self.max_length)  # fmt: skip

    def generate(
        self, source_ids: Any, max_new_tokens: int, start_id: int, **kwargs: Any
    ) -> list[list[int]]:
        """Decodes a target for each source id list, starting from `start_id`.

        Keyword arguments as `CausalLM.generate` (`sampler`, `num_beams`, `stop_token_ids`,
        ...). Returns a list with the generated target ids of each source (without the start
        id, and without the stop id that ended it).
        """
        from keras_attn.decoding import decode

        check_renamed(kwargs, ("pad_id",))
        prompts = [[start_id] for _ in range(len(source_ids))]
        return decode(self.runner(source_ids), prompts, max_new_tokens, **kwargs)


# What a `Seq2SeqLM` reads off its backbone by name (`model.decoder_blocks`, `model.hidden_dim`).
Seq2SeqLM.backbone_attributes = frozenset(Seq2SeqBackbone.config_args) | {
    "token_embedding",
    "encoder_token_embedding", "decoder_token_embedding", "encoder_position_embedding",
    "decoder_position_embedding", "encoder_blocks", "decoder_blocks", "encoder_final_norm",
    "decoder_final_norm",
}  # fmt: skip

Seq2Seq = Seq2SeqLM
# Configs written before the backbone/task split name the class "Seq2Seq" (their weights,
# not nested under a backbone, do not load into the new layout).
keras.saving.get_custom_objects()["keras_attn>Seq2Seq"] = Seq2SeqLM
