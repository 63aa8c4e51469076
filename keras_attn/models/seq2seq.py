"""The sequence-to-sequence task: an encoder-decoder backbone and its output projection, trained
with teacher forcing, decoded with the encoder run once and cross-attention keys and values
projected once."""

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import keras
import numpy as np
from keras import ops

from keras_attn.checks import check_renamed
from keras_attn.losses import SparseCrossEntropy
from keras_attn.models.backbone import HoldsBackbone
from keras_attn.models.cached import empty_caches
from keras_attn.models.causal_lm import backbone_of, fresh_inputs, lm_loss
from keras_attn.models.seq2seq_backbone import Seq2SeqBackbone
from keras_attn.models.task import Task, float32_logits
from keras_attn.types import Tensor

if TYPE_CHECKING:
    from keras_attn.decoding import Runner


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
        logits = float32_logits(backbone.logits(y), "logits")
        super().__init__(inputs, logits, name=name, preprocessor=preprocessor, **trainable)
        self.backbone = backbone

    def default_loss(self) -> SparseCrossEntropy:
        return lm_loss(self.pad_token_id)  # BART's id 0 and Marian's are real labels

    @property
    def max_length(self) -> int | None:
        """The longest target the position table allows (None: sinusoidal or relative)."""
        rows = getattr(self.decoder_position_embedding, "sequence_length", None)
        return None if rows is None else rows - self.position_offset

    def encode(
        self, source_ids: Tensor, maps: dict[str, dict[str, Tensor]] | None = None
    ) -> Tensor:
        """The encoder's output `(batch, S, hidden)` for int ids `(batch, S)` (0 = padding);
        with a dict `maps`, each block's attention weights are written into it."""
        source_ids = ops.convert_to_tensor(source_ids, "int32")
        side = self.encoder_side
        x = side.embed(source_ids)
        mask, bias = side.padding(source_ids), side.score_bias(x)
        for block in self.encoder_blocks:
            if maps is None:
                x = block(x, padding_mask=mask, **bias)
            else:
                x, weights = block(x, padding_mask=mask, return_attention_scores=True, **bias)
                maps[block.name] = {"self": weights}
        return self.encoder_final_norm(x) if self.encoder_final_norm is not None else x

    def _logits(self, y):
        if self.decoder_final_norm is not None:
            y = self.decoder_final_norm(y)
        return ops.cast(self.backbone.logits(y), "float32")

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
            "source_mask": self.encoder_side.padding(source_ids),
            "source_ids": source_ids,
        }

    def call_with_cache(
        self, token_ids: Tensor, cache: dict[str, Any], cache_update_index: int | Tensor
    ) -> tuple[Tensor, dict[str, Any]]:
        """Logits of target `token_ids` placed at `cache_update_index`, and the new state."""
        y = self.decoder_side.embed(token_ids, cache_update_index)
        length = ops.shape(cache["caches"][0])[2]
        bias = self.decoder_side.score_bias(y, length, cache_update_index)
        updated = []
        for block, self_cache, cross_cache in zip(
            self.decoder_blocks, cache["caches"], cache["cross_caches"], strict=True
        ):
            y, self_cache = block(
                y, self_attention_cache=self_cache,
                self_attention_cache_update_index=cache_update_index,
                cross_attention_cache=cross_cache, encoder_padding_mask=cache["source_mask"],
                **bias,
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
        y = self.decoder_side.embed(target)
        masks = {"encoder_padding_mask": self.encoder_side.padding(source)}
        if self.mask_decoder_padding:
            masks["decoder_padding_mask"] = self.decoder_side.padding(target)
        bias = self.decoder_side.score_bias(y)
        for block in self.decoder_blocks:
            y, self_weights, cross_weights = block(
                y, encoded, return_attention_scores=True, **masks, **bias
            )
            maps[block.name] = {"self": self_weights, "cross": cross_weights}
        return self._logits(y), maps

    def runner(self, source_ids: Any) -> "Runner":
        """The decoding `Runner` of targets for `source_ids` (a list of id lists): the sources
        are encoded once, here."""
        from keras_attn.decoding import Runner, as_prompts

        sources = as_prompts(source_ids)
        padded = np.full(
            (len(sources), max(len(s) for s in sources)), self.pad_token_id, dtype="int32"
        )
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

    @property
    def never_generated_id(self) -> int | None:
        """The padding id where generation never writes it (the decoder masks it, or the
        checkpoint bans it); None where it may."""
        banned = self.mask_decoder_padding or self.suppress_padding
        return self.pad_token_id if banned else None

    def generate(
        self, sources: Any, max_new_tokens: int, start_id: int | None = None, **kwargs: Any
    ) -> list[list[int]] | list[str] | str:
        """Decodes a target for each source, starting from `start_id` (default: the
        checkpoint's `decoder_start_token_id`).

        `sources`: id lists, or with a preprocessor a string or a list of strings (the answer
        is then the target text, special tokens left out). Keyword arguments as
        `keras_attn.decoding.decode` (`sampler`, `num_beams`, `length_penalty`,
        `early_stopping`, `no_repeat_ngram_size`, `stop_token_ids`: default the
        preprocessor's end id, `forced_eos_token_id` and `forced_bos_token_id`: default the
        checkpoint's, ...). Returns the generated target ids of each source (without the start
        id, and without the stop id that ended it), or their text.
        """
        from keras_attn.decoding import decode

        check_renamed(kwargs, ("pad_id",))
        start_id = self.decoder_start_token_id if start_id is None else start_id
        if start_id is None:
            raise ValueError(
                "`start_id` is needed: the model has no decoder_start_token_id. Received: "
                "start_id=None"
            )
        # The pretrained families may generate their padding id (T5's is its start id), but
        # for Marian's, which its checkpoints ban.
        kwargs.setdefault("pad_token_id", self.never_generated_id)
        kwargs.setdefault("forced_eos_token_id", self.forced_eos_token_id)
        kwargs.setdefault("forced_bos_token_id", self.forced_bos_token_id)
        text = isinstance(sources, str) or (
            isinstance(sources, (list, tuple)) and bool(sources)
            and all(isinstance(s, str) for s in sources)
        )  # fmt: skip
        if not text:
            prompts = [[start_id] for _ in range(len(sources))]
            return decode(self.runner(sources), prompts, max_new_tokens, **kwargs)
        preprocessor = self.preprocessor
        if preprocessor is None:
            raise ValueError(
                "`sources` are strings, and the model has no preprocessor to tokenize them. "
                "Pass id lists, or load the model with `Seq2SeqLM.from_pretrained(folder)`."
            )
        texts = [sources] if isinstance(sources, str) else list(sources)
        packed = np.asarray(preprocessor(texts)["encoder_token_ids"])
        ids = [[int(t) for t in row if t != preprocessor.pad_token_id] for row in packed]
        if kwargs.get("stop_token_ids") is None:
            kwargs["stop_token_ids"] = preprocessor.end_token_ids
        new = decode(self.runner(ids), [[start_id]] * len(ids), max_new_tokens, **kwargs)
        out = [detokenize(preprocessor, row) for row in new]
        return out[0] if isinstance(sources, str) else out

    def save_pretrained(self, folder: "str | os.PathLike[str]", **kwargs: Any) -> None:
        """Writes the backbone as a Hugging Face BART, Marian or T5 folder (`model_type`,
        `max_shard_size`: see `keras_attn.pretrained.save_pretrained`)."""
        from keras_attn.pretrained import save_pretrained

        save_pretrained(self.backbone, folder, **kwargs)

    @classmethod
    def from_pretrained(
        cls,
        folder: "str | os.PathLike[str]",
        strict: bool = True,
        preprocessor: Any = "auto",
        **kwargs: Any,
    ) -> "Seq2SeqLM":
        """The task on `Seq2SeqBackbone.from_pretrained(folder, **kwargs)` (a Hugging Face BART,
        Marian or T5 folder). `preprocessor="auto"` (the default) gives it the folder's
        own when it has one (`tokenizer.json`, T5's `spiece.model`, Marian's pair): its
        tokenizer, a packer adding the special ids its post-processor adds, and the
        checkpoint's decoder start id, so `generate` takes strings; `None` gives it none."""
        backbone = Seq2SeqBackbone.from_pretrained(folder, strict=strict, **kwargs)
        if isinstance(preprocessor, str) and preprocessor == "auto":
            preprocessor = seq2seq_folder_preprocessor(folder, backbone)
        return cls(backbone, preprocessor=preprocessor)


def detokenize(preprocessor: Any, ids: list[int]) -> str:
    """Target ids as text, without the tokenizer's special tokens (`transformers`'
    `skip_special_tokens=True`)."""
    tokenizer = preprocessor.target_tokenizer or preprocessor.tokenizer
    special = {tokenizer.token_to_id(t) for t in tokenizer.special_tokens}
    kept = [t for t in ids if t not in special]
    if not kept:
        return ""
    return tokenizer.detokenize([kept]).numpy()[0].decode("utf-8")


def seq2seq_folder_preprocessor(folder: "str | os.PathLike[str]", backbone: Any) -> Any:
    """A `Seq2SeqLMPreprocessor` for a folder with a `tokenizer.json`, T5's `spiece.model` or
    Marian's `source.spm`/`target.spm`/`vocab.json` (None without any)."""
    # Deferred: the preprocessing and tokenizers run in TensorFlow.
    from keras_attn.preprocessing.packers import StartEndPacker
    from keras_attn.preprocessing.seq2seq import Seq2SeqLMPreprocessor
    from keras_attn.tokenizers import from_tokenizer_json
    from keras_attn.tokenizers.loading import folder_tokenizer_json, single_text_ids

    length = backbone.max_sequence_length or 512
    if os.path.exists(os.path.join(os.fspath(folder), "source.spm")):  # Marian's pair
        from keras_attn.tokenizers.marian import MarianTokenizer

        source = MarianTokenizer.from_pretrained(folder)
        eos = source.token_to_id("</s>")
        packer = StartEndPacker(length, None, eos, pad_value=backbone.pad_token_id)
        target = MarianTokenizer.from_pretrained(folder, side="target")
        first = backbone.decoder_start_token_id or 0
        return Seq2SeqLMPreprocessor(source, packer, first, target_tokenizer=target)
    spec = folder_tokenizer_json(os.fspath(folder))
    if spec is None:
        return None
    start, end = single_text_ids(spec)
    packer = StartEndPacker(length, start, end, pad_value=backbone.pad_token_id)
    return Seq2SeqLMPreprocessor(
        from_tokenizer_json(spec), packer, backbone.decoder_start_token_id or 0
    )


# What a `Seq2SeqLM` reads off its backbone by name (`model.decoder_blocks`, `model.hidden_dim`).
Seq2SeqLM.backbone_attributes = frozenset(Seq2SeqBackbone.config_args) | {
    "token_embedding",
    "encoder_token_embedding", "decoder_token_embedding", "encoder_position_embedding",
    "decoder_position_embedding", "encoder_blocks", "decoder_blocks", "encoder_final_norm",
    "decoder_final_norm", "encoder_side", "decoder_side",
}  # fmt: skip

Seq2Seq = Seq2SeqLM
# Configs written before the backbone/task split name the class "Seq2Seq" (their weights,
# not nested under a backbone, do not load into the new layout).
keras.saving.get_custom_objects()["keras_attn>Seq2Seq"] = Seq2SeqLM
