"""Encoder tasks on any `EncoderBackbone`: sequence and token classification, span QA,
multiple choice."""

import os
from typing import Any, Self

import keras
import numpy as np
from keras import ops

from keras_attn.checks import (
    check_choice,
    check_hf_names,
    check_positive_ints,
    check_rate,
    check_renamed,
)
from keras_attn.layers.masks import mask_value
from keras_attn.losses import SparseCrossEntropy
from keras_attn.models.encoder import EncoderBackbone, encoder_inputs
from keras_attn.models.task import Task, float32_logits
from keras_attn.types import Shape, Tensor


class Head(Task):
    """A task made of an `EncoderBackbone` (`task.backbone`) and a few layers on top (not used
    on its own)."""

    nested_models = ("backbone",)
    # `from_pretrained` attaches a `MaskedLMPreprocessor` (masking for `fit`) when True.
    masked_lm = False
    # The checkpoint heads `from_pretrained` loads (`keras_attn.pretrained.heads`).
    pretrained_heads: tuple[str, ...] = ()

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Any:
        config = dict(config)
        if "encoder" in config:  # written before the backbone/task split
            config["backbone"] = config.pop("encoder")
        return super().from_config(config)

    def default_loss(self) -> SparseCrossEntropy | dict[str, SparseCrossEntropy]:
        return SparseCrossEntropy()

    @classmethod
    def from_pretrained(
        cls,
        folder: str | os.PathLike[str],
        strict: bool = True,
        backbone_kwargs: dict[str, Any] | None = None,
        sequence_length: int | None = None,
        **kwargs: Any,
    ) -> Self:
        """This head on `EncoderBackbone.from_pretrained(folder, **backbone_kwargs)`; `kwargs`
        are the head's own (`num_classes`, …). A classifier's layers start from fresh
        weights; `MaskedLM` and `EncoderPretrainer` load the checkpoint's pretraining heads
        when it has them.

        When the folder has a WordPiece vocabulary, the head gets a `TextPreprocessor`
        (`[CLS] text [SEP]`, packed to `sequence_length`, by default the longest input the
        encoder takes): `fit`, `predict` and export then take raw strings. Pass
        `preprocessor=None` for a head without one.

        Example:
            >>> from keras_attn.data import checkpoint_folder  # the packaged all-MiniLM-L6-v2
            >>> model = SequenceClassifier.from_pretrained(
            ...     checkpoint_folder(), num_classes=3, sequence_length=64)
            >>> model.preprocessor.packer.sequence_length, model.predict(["hi"], verbose=0).shape
            (64, (1, 3))
        """
        check_renamed(kwargs, ("encoder_kwargs",))
        check_hf_names(kwargs)  # `num_labels`, before the backbone is loaded
        from keras_attn.pretrained.heads import head_activation, head_keys, load_heads

        keys = head_keys(folder, cls.pretrained_heads)
        backbone = EncoderBackbone.from_pretrained(
            folder, strict=strict, head_keys=keys, **(backbone_kwargs or {})
        )
        if cls.pretrained_heads:
            kwargs.setdefault("activation", head_activation(folder, backbone))
        if "preprocessor" not in kwargs:
            kwargs["preprocessor"] = folder_preprocessor(
                folder,
                sequence_length or backbone.max_sequence_length - backbone.position_offset,
                masked_lm=cls.masked_lm,
            )
        task = cls(backbone, **kwargs)
        load_heads(task, folder, cls.pretrained_heads)
        return task


def folder_preprocessor(
    folder: str | os.PathLike[str], sequence_length: int, masked_lm: bool = False
) -> Any:
    """BERT's preprocessing for a Hugging Face folder: its WordPiece vocabulary (`vocab.txt` or
    `tokenizer.json`) and `[CLS] text [SEP]` packed to `sequence_length`; with `masked_lm`, a
    `MaskedLMPreprocessor` that also masks 15% of the tokens (at most ⌈0.15 ·
    sequence_length⌉ per row) with the folder's `[MASK]`. None when the folder has no
    vocabulary, or TensorFlow is not installed to run the tokenizer (a JAX or PyTorch-only
    install)."""
    if not any(os.path.exists(os.path.join(folder, name))
               for name in ("vocab.txt", "tokenizer.json")):  # fmt: skip
        return None
    try:
        from keras_attn.preprocessing import (
            MaskedLMMaskGenerator,
            MaskedLMPreprocessor,
            SegmentPacker,
            TextPreprocessor,
        )
        from keras_attn.tokenizers import WordPieceTokenizer
    except ModuleNotFoundError as error:
        if error.name in ("tensorflow", "tensorflow_text"):
            return None
        raise
    tokenizer = WordPieceTokenizer.from_pretrained(folder)
    packer = SegmentPacker(
        sequence_length,
        start_value=tokenizer.token_to_id("[CLS]"),
        end_value=tokenizer.token_to_id("[SEP]"),
    )
    if not masked_lm:
        return TextPreprocessor(tokenizer, packer)
    masker = MaskedLMMaskGenerator(
        tokenizer.vocabulary_size(),
        tokenizer.token_to_id("[MASK]"),
        mask_selection_length=max(1, -(-sequence_length * 3 // 20)),
        # The packer's ids are all set (from the vocabulary) just above.
        unselectable_token_ids=sorted({0, packer.start_value, packer.end_value, packer.pad_value}),  # type: ignore[arg-type]
    )
    return MaskedLMPreprocessor(tokenizer, packer, masker)


def _classify(x, num_classes, dropout, name, output_name="logits"):
    """Dropout → Dense → float32 logits: the output of every classification head."""
    x = keras.layers.Dropout(dropout, name="head_dropout")(x)
    return float32_logits(keras.layers.Dense(num_classes, name=name)(x), output_name)


@keras.saving.register_keras_serializable(package="keras_attn")
class SequenceClassifier(Head):
    """One label per sequence: pooled encoder output → dropout → Dense → logits.

    Args:
        backbone: an `EncoderBackbone`.
        num_classes: int.
        pooling: `"cls"` (BERT's pooler on the first token) or `"mean"` (mean over the real
            tokens; padding excluded).
        dropout: float. Defaults to `0.1`.
    Returns:
        logits `(batch, num_classes)`, float32.
    """

    config_args = ("backbone", "num_classes", "pooling", "dropout")

    def __init__(
        self,
        backbone: EncoderBackbone,
        num_classes: int,
        pooling: str = "cls",
        dropout: float = 0.1,
        name: str | None = None,
        **kwargs: Any,
    ) -> None:
        check_positive_ints(num_classes=num_classes)
        check_choice("pooling", pooling, ("cls", "mean"))
        check_rate("dropout", dropout)
        inputs = encoder_inputs(backbone)
        outputs = backbone(inputs)
        if pooling == "cls":
            x = outputs["pooled_output"]
        else:
            x = keras.layers.GlobalAveragePooling1D(name="mean_pooling")(
                outputs["sequence_output"], mask=backbone.padding_mask(inputs)
            )
        logits = _classify(x, num_classes, dropout, "classifier")
        super().__init__(inputs, logits, name=name or "sequence_classifier", **kwargs)
        self._set_config_args(locals())


@keras.saving.register_keras_serializable(package="keras_attn")
class TokenClassifier(Head):
    """One label per token (tagging, NER): sequence output → dropout → Dense → logits.

    Train with `SparseCrossEntropy(ignore_class=...)` to skip padding and the non-first
    sub-tokens of a word (the default loss ignores label `-100`, as Hugging Face does).

    Args:
        backbone: an `EncoderBackbone`.
        num_classes: int.
        dropout: float. Defaults to `0.1`.
        ignore_label: int. Label of positions without a target. Defaults to `-100`.
    Returns:
        logits `(batch, seq, num_classes)`, float32.
    """

    config_args = ("backbone", "num_classes", "dropout", "ignore_label")

    def __init__(
        self,
        backbone: EncoderBackbone,
        num_classes: int,
        dropout: float = 0.1,
        ignore_label: int = -100,
        name: str | None = None,
        **kwargs: Any,
    ) -> None:
        check_positive_ints(num_classes=num_classes)
        check_rate("dropout", dropout)
        inputs = encoder_inputs(backbone)
        x = backbone(inputs)["sequence_output"]
        logits = _classify(x, num_classes, dropout, "classifier")
        super().__init__(inputs, logits, name=name or "token_classifier", **kwargs)
        self._set_config_args(locals())

    def default_loss(self) -> SparseCrossEntropy:
        return SparseCrossEntropy(ignore_class=self.ignore_label)


@keras.saving.register_keras_serializable(package="keras_attn")
class SpanQA(Head):
    """Extractive question answering: a start and an end logit per token.

    Padded positions get a very negative logit, so the softmax over positions (the loss)
    never picks them. Decode answers with `best_spans`.

    Args:
        backbone: an `EncoderBackbone`.
    Returns:
        dict of float32 `start_logits` and `end_logits`, each `(batch, seq)`.
    """

    config_args = ("backbone",)

    def __init__(self, backbone: EncoderBackbone, name: str | None = None, **kwargs: Any) -> None:
        inputs = encoder_inputs(backbone)
        x = backbone(inputs)["sequence_output"]
        x = keras.layers.Dense(2, name="span_logits")(x)
        x = ops.where(ops.expand_dims(backbone.padding_mask(inputs), -1), x, mask_value(x.dtype))
        outputs = {
            "start_logits": float32_logits(x[..., 0], "start_logits"),
            "end_logits": float32_logits(x[..., 1], "end_logits"),
        }
        super().__init__(inputs, outputs, name=name or "span_qa", **kwargs)
        self._set_config_args(locals())

    def default_loss(self) -> dict[str, SparseCrossEntropy]:
        return {"start_logits": SparseCrossEntropy(), "end_logits": SparseCrossEntropy()}


def best_spans(
    start_logits: Tensor, end_logits: Tensor, max_answer_length: int, allowed: Tensor | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The best answer span of each row: `argmax_{i ≤ j < i + max_answer_length} s_i + e_j`.

    Args:
        start_logits, end_logits: arrays `(batch, seq)`.
        max_answer_length: int. Longest answer in tokens.
        allowed: optional bool `(batch, seq)`; spans must start and end at allowed positions
            (the context, not the question or padding).
    Returns:
        `(starts, ends, scores)`, arrays `(batch,)`; `ends` is inclusive.
    """
    check_positive_ints(max_answer_length=max_answer_length)
    start = np.asarray(start_logits, dtype="float64")
    end = np.asarray(end_logits, dtype="float64")
    if start.shape != end.shape or start.ndim != 2:
        raise ValueError(
            "`start_logits` and `end_logits` must both be (batch, seq). Received: "
            f"start_logits.shape={start.shape}, end_logits.shape={end.shape}"
        )
    if allowed is not None:
        allowed = np.asarray(allowed, dtype=bool)
        start = np.where(allowed, start, -np.inf)
        end = np.where(allowed, end, -np.inf)
    length = start.shape[1]
    i, j = np.arange(length)[:, None], np.arange(length)[None, :]
    valid = (j >= i) & (j - i < max_answer_length)  # (seq, seq)
    scores = np.where(valid, start[:, :, None] + end[:, None, :], -np.inf)
    flat = scores.reshape(len(scores), -1).argmax(-1)
    starts, ends = np.divmod(flat, length)
    return starts, ends, scores.reshape(len(scores), -1)[np.arange(len(scores)), flat]


@keras.saving.register_keras_serializable(package="keras_attn")
class MergeChoices(keras.layers.Layer):
    """`(batch, num_choices, seq)` → `(batch · num_choices, seq)`; the length stays dynamic."""

    def call(self, inputs: Tensor) -> Tensor:
        return ops.reshape(inputs, (-1, ops.shape(inputs)[-1]))

    def compute_output_shape(self, input_shape: Shape) -> Shape:
        # The choices axis is static (`encoder_inputs(leading_shape=(num_choices,))`).
        batch = None if input_shape[0] is None else input_shape[0] * input_shape[1]  # type: ignore[operator]
        return (batch, input_shape[-1])


@keras.saving.register_keras_serializable(package="keras_attn")
class SplitChoices(keras.layers.Layer):
    """`(batch · num_choices, 1)` logits → `(batch, num_choices)`: one row per question."""

    def __init__(self, num_choices: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        check_positive_ints(num_choices=num_choices)
        self.num_choices = num_choices

    def call(self, inputs: Tensor) -> Tensor:
        return ops.reshape(inputs, (-1, self.num_choices))

    def compute_output_shape(self, input_shape: Shape) -> Shape:
        batch = None if input_shape[0] is None else input_shape[0] // self.num_choices
        return (batch, self.num_choices)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "num_choices": self.num_choices}


@keras.saving.register_keras_serializable(package="keras_attn")
class MultipleChoice(Head):
    """One logit per choice; the softmax runs over the choices.

    Inputs are the encoder's, with a choice axis: `token_ids (batch, num_choices, seq)` (each
    choice packed with its context, e.g. `[CLS] context [SEP] choice [SEP]`). The encoder
    runs over all `batch · num_choices` sequences at once; each pooled output gives one logit.

    Args:
        backbone: an `EncoderBackbone`.
        num_choices: int.
        dropout: float. Defaults to `0.1`.
    Returns:
        logits `(batch, num_choices)`, float32.
    """

    config_args = ("backbone", "num_choices", "dropout")

    def __init__(
        self,
        backbone: EncoderBackbone,
        num_choices: int,
        dropout: float = 0.1,
        name: str | None = None,
        **kwargs: Any,
    ) -> None:
        check_positive_ints(num_choices=num_choices)
        check_rate("dropout", dropout)
        inputs = encoder_inputs(backbone, leading_shape=(num_choices,))
        merge = MergeChoices(name="merge_choices")
        flat = {key: merge(value) for key, value in inputs.items()}
        x = _classify(backbone(flat)["pooled_output"], 1, dropout, "choice_logit", "choice_logits")
        logits = SplitChoices(num_choices, name="logits")(x)
        super().__init__(inputs, logits, name=name or "multiple_choice", **kwargs)
        self._set_config_args(locals())
