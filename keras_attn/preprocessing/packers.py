"""Packing token ids into fixed-length model inputs: start/end tokens, segment pairs, padding."""

from collections.abc import Sequence
from typing import Any

import keras
import tensorflow as tf
import tensorflow_text as tf_text

from keras_attn.checks import check_positive_int
from keras_attn.preprocessing.base import PreprocessingLayer, to_ragged
from keras_attn.types import Tensor


class Packer(PreprocessingLayer):
    """Base of the packers: the length, special ids and padding id they all take."""

    def __init__(
        self,
        sequence_length: int,
        start_value: int | None,
        end_value: int | None,
        pad_value: int,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        check_positive_int("sequence_length", sequence_length)
        self.sequence_length = sequence_length
        self.start_value = start_value
        self.end_value = end_value
        self.pad_value = pad_value

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "sequence_length": self.sequence_length,
            "start_value": self.start_value,
            "end_value": self.end_value,
            "pad_value": self.pad_value,
        }


@keras.saving.register_keras_serializable(package="keras_attn")
class StartEndPacker(Packer):
    """Adds optional start and end ids, truncates to fit, pads to `sequence_length`.

    Truncation keeps the first tokens and always keeps the end id (GPT `[BOS] … [EOS]`).

    Args:
        sequence_length: int. Output length.
        start_value: optional int prepended (e.g. `[BOS]`).
        end_value: optional int appended (e.g. `[EOS]`).
        pad_value: int. Defaults to `0` (`[PAD]`).
        return_padding_mask: bool. Also return the bool padding mask (`True` = real token).
    Call arguments:
        inputs: int ids `(batch, None)` ragged or dense, or `(None,)` for one sequence.
    Returns:
        int32 `(batch, sequence_length)` [and bool `(batch, sequence_length)`].
    Example:
        >>> StartEndPacker(5, start_value=5, end_value=6)([[10, 11, 12, 13]]).numpy().tolist()
        [[5, 10, 11, 12, 6]]
    """

    def __init__(
        self,
        sequence_length: int,
        start_value: int | None = None,
        end_value: int | None = None,
        pad_value: int = 0,
        return_padding_mask: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(sequence_length, start_value, end_value, pad_value, **kwargs)
        extra = (start_value is not None) + (end_value is not None)
        if sequence_length <= extra:
            raise ValueError(
                f"`sequence_length` must leave room for a token besides the start/end values. "
                f"Received: sequence_length={sequence_length}"
            )
        self.return_padding_mask = return_padding_mask

    def call(
        self, inputs: list[Any] | Tensor | tf.RaggedTensor
    ) -> tf.Tensor | tuple[tf.Tensor, tf.Tensor]:
        ids, single = to_ragged(inputs)
        room = self.sequence_length - (self.start_value is not None) - (self.end_value is not None)
        ids = ids[:, :room]
        batch = ids.nrows()
        parts = [ids]
        if self.start_value is not None:
            parts.insert(0, tf.fill([batch, 1], tf.constant(self.start_value, tf.int32)))
        if self.end_value is not None:
            parts.append(tf.fill([batch, 1], tf.constant(self.end_value, tf.int32)))
        ids = tf.concat(parts, axis=1) if len(parts) > 1 else ids
        dense, mask = tf_text.pad_model_inputs(ids, self.sequence_length, self.pad_value)
        mask = tf.cast(mask, tf.bool)
        if single:
            dense, mask = dense[0], mask[0]
        return (dense, mask) if self.return_padding_mask else dense

    def compute_output_spec(
        self, inputs: keras.KerasTensor
    ) -> keras.KerasTensor | tuple[keras.KerasTensor, keras.KerasTensor]:
        shape = (inputs.shape[0], self.sequence_length)
        ids = keras.KerasTensor(shape, dtype="int32")
        return (ids, keras.KerasTensor(shape, dtype="bool")) if self.return_padding_mask else ids

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "return_padding_mask": self.return_padding_mask}


TRUNCATE = {
    "round_robin": tf_text.RoundRobinTrimmer,
    "longest_first": tf_text.ShrinkLongestTrimmer,
    "waterfall": tf_text.WaterfallTrimmer,
}


@keras.saving.register_keras_serializable(package="keras_attn")
class SegmentPacker(Packer):
    """Packs segments as BERT does: `[CLS] a [SEP] b [SEP]`, with segment ids and padding.

    Args:
        sequence_length: int. Output length.
        start_value: int. Id placed first (`[CLS]`).
        end_value: int. Id closing every segment (`[SEP]`).
        pad_value: int. Defaults to `0`.
        truncate: `"round_robin"` (default: take one token from each segment in turn),
            `"longest_first"` (shorten the longest segment first) or `"waterfall"` (the last
            segments lose tokens first).
    Call arguments:
        inputs: a tuple of segments, each int ids `(batch, None)` (ragged or dense).
    Returns:
        `{"token_ids": int32 (batch, L), "segment_ids": int32 (batch, L),
          "padding_mask": bool (batch, L)}`.
    """

    def __init__(self, sequence_length: int, start_value: int, end_value: int,
                 pad_value: int = 0, truncate: str = "round_robin",
                 **kwargs: Any) -> None:  # fmt: skip
        super().__init__(sequence_length, start_value, end_value, pad_value, **kwargs)
        if truncate not in TRUNCATE:
            raise ValueError(
                f"`truncate` must be one of {sorted(TRUNCATE)}. Received: truncate={truncate!r}"
            )
        self.truncate = truncate

    def call(self, inputs: Sequence[list[Any] | Tensor | tf.RaggedTensor]) -> dict[str, tf.Tensor]:
        if not isinstance(inputs, (tuple, list)) or not inputs:
            raise ValueError(
                "`inputs` must be a tuple of segments (ragged or dense id tensors). "
                f"Received: {type(inputs).__name__}"
            )
        segments = [to_ragged(x, f"inputs[{i}]")[0] for i, x in enumerate(inputs)]
        budget = self.sequence_length - 1 - len(segments)  # [CLS] and one [SEP] per segment
        if budget < len(segments):
            raise ValueError(
                f"`sequence_length`={self.sequence_length} leaves no room for "
                f"{len(segments)} segments and their special tokens"
            )
        trimmed = TRUNCATE[self.truncate](budget).trim(segments)
        ids, segment_ids = tf_text.combine_segments(trimmed, self.start_value, self.end_value)
        ids, mask = tf_text.pad_model_inputs(ids, self.sequence_length, self.pad_value)
        segment_ids, _ = tf_text.pad_model_inputs(segment_ids, self.sequence_length, 0)
        return {
            "token_ids": tf.cast(ids, tf.int32),
            "segment_ids": tf.cast(segment_ids, tf.int32),
            "padding_mask": tf.cast(mask, tf.bool),
        }

    def compute_output_spec(
        self, inputs: Sequence[keras.KerasTensor]
    ) -> dict[str, keras.KerasTensor]:
        shape = (inputs[0].shape[0], self.sequence_length)
        return {
            "token_ids": keras.KerasTensor(shape, dtype="int32"),
            "segment_ids": keras.KerasTensor(shape, dtype="int32"),
            "padding_mask": keras.KerasTensor(shape, dtype="bool"),
        }

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "truncate": self.truncate}
