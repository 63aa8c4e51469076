"""A task's preprocessor: raw strings to the model's inputs, saved inside the task's `.keras`.

It is the one place that says how text becomes ids for a model: `Task.fit`/`predict`/
`generate` run it on raw strings, and `keras_attn_export.export_model` writes the SavedModel's
`serve_text`, the tokenizer files and the manifest's `packer` from it, so what is served is
what was trained (keras-hub's task/preprocessor shape).
"""

from typing import Any, Self

import keras
import tensorflow as tf
from keras_attn_serving.chat_template import ChatTemplate

from keras_attn.checks import check_positive_int
from keras_attn.preprocessing.base import PreprocessingLayer
from keras_attn.preprocessing.masked_lm import MaskedLMMaskGenerator
from keras_attn.preprocessing.packers import SegmentPacker, StartEndPacker
from keras_attn.types import Tensor

FEATURES = ("token_ids", "segment_ids", "padding_mask")


@keras.saving.register_keras_serializable(package="keras_attn")
class TextPreprocessor(PreprocessingLayer):
    """Strings → `{"token_ids", "segment_ids", "padding_mask"}`, int32 `(batch, length)`.

    The tokenizer splits each string into ids; the packer adds the special tokens the model
    was trained with (`SegmentPacker`: BERT's `[CLS] a [SEP]`; `StartEndPacker`: GPT's
    `[BOS] … [EOS]`), truncates and pads. Without a packer rows are padded with 0 to the
    longest (cut at `sequence_length` when given). `padding_mask` is 1 at real tokens
    (Hugging Face's `attention_mask`); `segment_ids` is 0 for a single segment.

    Args:
        tokenizer: a `keras_attn.tokenizers.Tokenizer`.
        packer: optional `SegmentPacker` or `StartEndPacker`.
        sequence_length: optional int; only without a packer (a packer has its own).
    Call arguments:
        inputs: strings (`str`, list, NumPy or tensor, `(batch,)`), or for a `SegmentPacker`
            a tuple of such, one per segment.
    Returns:
        dict of int32 `(batch, length)` tensors.
    Example:
        >>> from keras_attn.tokenizers import SPECIAL_TOKENS, WordPieceTokenizer
        >>> tokenizer = WordPieceTokenizer([*SPECIAL_TOKENS, "hello", "world"])
        >>> packer = SegmentPacker(6, start_value=2, end_value=3)
        >>> TextPreprocessor(tokenizer, packer)(["hello world"])["token_ids"].numpy().tolist()
        [[2, 7, 8, 3, 0, 0]]
    """

    def __init__(
        self,
        tokenizer: PreprocessingLayer,
        packer: SegmentPacker | StartEndPacker | None = None,
        sequence_length: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        # Duck-typed: keras_attn.tokenizers sits above this package (its base class is here).
        if not isinstance(tokenizer, PreprocessingLayer) or not hasattr(tokenizer, "detokenize"):
            raise ValueError(
                "`tokenizer` must be a keras_attn Tokenizer. "
                f"Received: tokenizer={type(tokenizer).__name__}"
            )
        if packer is not None and not isinstance(packer, (SegmentPacker, StartEndPacker)):
            raise ValueError(
                "`packer` must be a SegmentPacker, a StartEndPacker or None. "
                f"Received: packer={type(packer).__name__}"
            )
        if sequence_length is not None:
            check_positive_int("sequence_length", sequence_length)
            if packer is not None:
                raise ValueError(
                    "`sequence_length` is the packer's own when a packer is given. Received: "
                    f"sequence_length={sequence_length}, packer.sequence_length="
                    f"{packer.sequence_length}"
                )
        if isinstance(packer, StartEndPacker) and packer.return_padding_mask:
            raise ValueError(
                "`packer` must return ids only (`return_padding_mask=False`): the preprocessor "
                "computes the padding mask itself."
            )
        self.tokenizer = tokenizer
        self.packer = packer
        self.sequence_length = sequence_length

    @property
    def max_length(self) -> int | None:
        """The longest row this preprocessor produces, or None."""
        return self.packer.sequence_length if self.packer is not None else self.sequence_length

    def call(self, inputs: Any) -> dict[str, tf.Tensor]:
        segments = inputs if isinstance(inputs, tuple) else (inputs,)
        if len(segments) > 1 and not isinstance(self.packer, SegmentPacker):
            raise ValueError(
                f"`inputs` has {len(segments)} segments; only a SegmentPacker packs more "
                f"than one. Received packer: {type(self.packer).__name__}"
            )
        ids = [self.tokenizer(segment) for segment in segments]
        if isinstance(self.packer, SegmentPacker):
            packed = self.packer(tuple(ids))
            return {
                "token_ids": packed["token_ids"],
                "segment_ids": packed["segment_ids"],
                "padding_mask": tf.cast(packed["padding_mask"], tf.int32),
            }
        (ids,) = ids
        if self.packer is not None:
            token_ids = self.packer(ids)
            mask = tf.cast(tf.not_equal(token_ids, self.packer.pad_value), tf.int32)
        else:
            if not isinstance(ids, tf.RaggedTensor):
                ids = tf.RaggedTensor.from_tensor(ids)
            if self.sequence_length is not None:
                ids = ids[:, : self.sequence_length]
            mask = tf.ones_like(ids, dtype=tf.int32).to_tensor(0)
            token_ids = ids.to_tensor(0)
        return {
            "token_ids": tf.cast(token_ids, tf.int32),
            "segment_ids": tf.zeros_like(token_ids, dtype=tf.int32),
            "padding_mask": mask,
        }

    def compute_output_spec(
        self, inputs: keras.KerasTensor | tuple[keras.KerasTensor, ...]
    ) -> dict[str, keras.KerasTensor]:
        first = inputs[0] if isinstance(inputs, tuple) else inputs
        shape = (first.shape[0], self.max_length)
        return {name: keras.KerasTensor(shape, dtype="int32") for name in FEATURES}

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "tokenizer": keras.saving.serialize_keras_object(self.tokenizer),
            "packer": keras.saving.serialize_keras_object(self.packer),
            "sequence_length": self.sequence_length,
        }

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Self:
        config = dict(config)
        for key in ("tokenizer", "packer"):
            if config.get(key) is not None:
                config[key] = keras.saving.deserialize_keras_object(config[key])
        return cls(**config)


def model_inputs(features: dict, model_input: Any) -> Tensor | dict[str, Tensor]:
    """The entries of `features` a model takes, in the structure of its `model.input`: a
    dict by input name, or the token ids alone for a model with one input."""
    if not isinstance(model_input, dict):
        return features["token_ids"]
    missing = sorted(set(model_input) - set(features))
    if missing:
        raise ValueError(
            f"the preprocessor makes {sorted(features)}; the model also takes {missing}"
        )
    return {name: features[name] for name in model_input}


@keras.saving.register_keras_serializable(package="keras_attn")
class CausalLMPreprocessor(TextPreprocessor):
    """`CausalLM`'s preprocessor: strings → ids, as `TextPreprocessor` (what `generate` and
    the server run), and for `fit`/`evaluate` on raw text the next-token pairs
    (`training_batch`): inputs the packed ids but the last, targets the ids but the first,
    sample weight 0 where the target is padding.

    A chat model's preprocessor also holds its chat template (rendered as `transformers`
    renders it, by `keras_attn_serving.chat_template`), the special tokens the template sees
    and the ids that end a turn: `CausalLM.generate` takes conversations through it, and
    export carries all three into the artifact for the server's chat routes.

    Args:
        tokenizer: a `keras_attn.tokenizers.Tokenizer`.
        packer: a `StartEndPacker` (`[BOS] text [EOS]`, padded to its `sequence_length`).
        chat_template: optional str, the Jinja source of the chat template.
        special_tokens: optional dict, the named special tokens the template sees
            (`{"bos_token": "<s>", "eos_token": "</s>"}`).
        end_token_ids: optional list of ints: ids that end a generation by default
            (`generation_config.json`'s `eos_token_id`).
    Example:
        >>> from keras_attn.preprocessing import StartEndPacker
        >>> from keras_attn.tokenizers import SPECIAL_TOKENS, WordPieceTokenizer
        >>> tokenizer = WordPieceTokenizer([*SPECIAL_TOKENS, "hello", "world"])
        >>> preprocessor = CausalLMPreprocessor(tokenizer, StartEndPacker(5, 2, 3))
        >>> x, y, weight = preprocessor.training_batch(["hello world"])
        >>> x["token_ids"].numpy().tolist(), y.numpy().tolist(), weight.numpy().tolist()
        ([[2, 7, 8, 3]], [[7, 8, 3, 0]], [[1.0, 1.0, 1.0, 0.0]])
    """

    def __init__(
        self,
        tokenizer: PreprocessingLayer,
        packer: StartEndPacker,
        chat_template: str | None = None,
        special_tokens: dict[str, str] | None = None,
        end_token_ids: list[int] | None = None,
        **kwargs: Any,
    ) -> None:
        if not isinstance(packer, StartEndPacker):
            raise ValueError(
                "`packer` must be a StartEndPacker (the ids a causal LM reads and predicts). "
                f"Received: packer={type(packer).__name__}"
            )
        super().__init__(tokenizer, packer, **kwargs)
        self.chat = None
        if chat_template is not None:
            if special_tokens is not None and not (
                isinstance(special_tokens, dict)
                and all(isinstance(v, str) for v in special_tokens.values())
            ):
                raise ValueError(
                    "`special_tokens` must be a dict of token names to strings. Received: "
                    f"special_tokens={special_tokens!r}"
                )
            self.chat = ChatTemplate(chat_template, special_tokens)
        if end_token_ids is not None and not (
            isinstance(end_token_ids, (list, tuple))
            and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                    for i in end_token_ids)
        ):  # fmt: skip
            raise ValueError(
                "`end_token_ids` must be a list of non-negative ids. Received: "
                f"end_token_ids={end_token_ids!r}"
            )
        self.chat_template = chat_template
        self.special_tokens = dict(special_tokens) if special_tokens else None
        self.end_token_ids = list(end_token_ids) if end_token_ids else None

    def apply_chat_template(self, conversation: Any, add_generation_prompt: bool = True) -> str:
        """The prompt text of a conversation (a list of `{"role", "content"}` dicts), as
        `transformers`' `apply_chat_template(..., tokenize=False)` renders it.

        Raises:
            ValueError: this preprocessor has no chat template, the conversation is
                malformed, or the template raised (its message).
        """
        if self.chat is None:
            raise ValueError(
                "this preprocessor has no chat template: give it `chat_template=` (a folder's "
                "`tokenizer_config.json` has one for instruct models)"
            )
        return self.chat.render(conversation, add_generation_prompt=add_generation_prompt)

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "chat_template": self.chat_template,
            "special_tokens": self.special_tokens,
            "end_token_ids": self.end_token_ids,
        }

    def training_batch(self, text: Any) -> tuple[dict[str, tf.Tensor], tf.Tensor, tf.Tensor]:
        """`(x, y, sample_weight)` for next-token training on `text`."""
        features = self(text)
        ids, mask = features["token_ids"], features["padding_mask"]
        x = {name: value[:, :-1] for name, value in features.items()}
        return x, ids[:, 1:], tf.cast(mask[:, 1:], tf.float32)


@keras.saving.register_keras_serializable(package="keras_attn")
class MaskedLMPreprocessor(TextPreprocessor):
    """`MaskedLM`'s preprocessor: tokenizer, packer and BERT's masking as one object.

    Called, it gives the packed features, as `TextPreprocessor`. For `fit`/`evaluate` on raw
    text (`training_batch`) it corrupts the packed ids with `masker` and returns the model's
    inputs (`token_ids` corrupted, `segment_ids`, `padding_mask`, `mask_positions`), the
    original ids at those positions as targets, and `mask_weights` as sample weights. NumPy
    text is masked once per call; a `tf.data.Dataset` of strings is masked anew each epoch.

    Args:
        tokenizer: a `keras_attn.tokenizers.Tokenizer`.
        packer: a `SegmentPacker` (`[CLS] a [SEP]`).
        masker: a `MaskedLMMaskGenerator` whose `unselectable_token_ids` hold padding and the
            packer's start and end ids (special tokens are never predicted).
    """

    def __init__(
        self,
        tokenizer: PreprocessingLayer,
        packer: SegmentPacker,
        masker: MaskedLMMaskGenerator,
        **kwargs: Any,
    ) -> None:
        if not isinstance(masker, MaskedLMMaskGenerator):
            raise ValueError(
                "`masker` must be a MaskedLMMaskGenerator. Received: masker=a "
                f"{type(masker).__name__}"
            )
        if not isinstance(packer, SegmentPacker):
            raise ValueError(
                f"`packer` must be a SegmentPacker. Received: packer={type(packer).__name__}"
            )
        special = {packer.start_value, packer.end_value, packer.pad_value} - {None}
        # `- {None}` leaves ints only; mypy keeps the attributes' `int | None`.
        missing = sorted(special - set(masker.unselectable_token_ids))  # type: ignore[type-var]
        if missing:
            raise ValueError(
                "`masker.unselectable_token_ids` must hold the packer's special ids, or "
                f"[CLS]/[SEP]/padding get masked and predicted. Missing: {missing}; received: "
                f"unselectable_token_ids={masker.unselectable_token_ids}"
            )
        super().__init__(tokenizer, packer, **kwargs)
        self.masker = masker

    def training_batch(self, text: Any) -> tuple[dict[str, tf.Tensor], tf.Tensor, tf.Tensor]:
        """`(x, y, sample_weight)` for masked-LM training on `text`."""
        features = self(text)
        masked = self.masker(features["token_ids"])
        x = {**features, "token_ids": masked["token_ids"],
             "mask_positions": masked["mask_positions"]}  # fmt: skip
        return x, masked["mask_ids"], masked["mask_weights"]

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "masker": keras.saving.serialize_keras_object(self.masker)}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Self:
        config = {**config, "masker": keras.saving.deserialize_keras_object(config["masker"])}
        return super().from_config(config)
