"""Text to the inputs of an encoder-decoder: source text to encoder ids, and (source, target)
pairs to teacher-forcing batches whose decoder inputs start with the decoder start id."""

from typing import Any, Self

import keras
import tensorflow as tf

from keras_attn.checks import check_non_negative_ints
from keras_attn.preprocessing.base import PreprocessingLayer
from keras_attn.preprocessing.packers import StartEndPacker


@keras.saving.register_keras_serializable(package="keras_attn")
class Seq2SeqLMPreprocessor(PreprocessingLayer):
    """Strings → `{"encoder_token_ids"}`; `(sources, targets)` → `(x, labels, sample_weight)`.

    Source and target are tokenized alike and packed with the checkpoint's special ids
    (`packer`: BART's `<s> … </s>`, T5's and Marian's `… </s>`), padded with `pad_value`.
    For training (`training_batch`), the labels are the packed target and the decoder reads
    them shifted right behind `decoder_start_token_id`, as `transformers`' `shift_tokens_right`
    builds `decoder_input_ids`; the sample weight is 0 at padding.

    Args:
        tokenizer: a `keras_attn.tokenizers.Tokenizer`.
        packer: a `StartEndPacker` for sources (its `pad_value` is the padding id).
        decoder_start_token_id: int. The first decoder input.
        decoder_sequence_length: optional int. Target length; defaults to the packer's.
        target_tokenizer: optional tokenizer of targets (Marian's `target.spm`); defaults to
            `tokenizer`.
    Call arguments:
        inputs: source strings (`str`, list, NumPy or tensor, `(batch,)`).
    Returns:
        `{"encoder_token_ids": int32 (batch, sequence_length)}`; `training_batch` returns
        `(x, labels, sample_weight)` with `x` the model's two inputs.
    Example:
        >>> lm = Seq2SeqLM.from_pretrained("path/to/t5-folder")  # doctest: +SKIP
        >>> x, y, w = lm.preprocessor.training_batch((["a house"], ["ein Haus"]))  # doctest: +SKIP
    """

    def __init__(
        self,
        tokenizer: PreprocessingLayer,
        packer: StartEndPacker,
        decoder_start_token_id: int,
        decoder_sequence_length: int | None = None,
        target_tokenizer: PreprocessingLayer | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if not isinstance(packer, StartEndPacker):
            raise ValueError(
                f"`packer` must be a StartEndPacker. Received: packer={type(packer).__name__}"
            )
        check_non_negative_ints(decoder_start_token_id=decoder_start_token_id)
        self.tokenizer, self.packer = tokenizer, packer
        self.target_tokenizer = target_tokenizer
        self.decoder_start_token_id = decoder_start_token_id
        self.decoder_sequence_length = decoder_sequence_length
        self.target_packer = StartEndPacker(
            decoder_sequence_length or packer.sequence_length, packer.start_value,
            packer.end_value, packer.pad_value,
        )  # fmt: skip

    @property
    def end_token_ids(self) -> list[int]:
        """The id that ends a target (generation's default stop id)."""
        return [] if self.packer.end_value is None else [self.packer.end_value]

    @property
    def pad_token_id(self) -> int:
        return int(self.packer.pad_value)

    def call(self, inputs: Any) -> dict[str, tf.Tensor]:
        ids = self.packer(self.tokenizer(inputs))
        return {"encoder_token_ids": tf.cast(ids, tf.int32)}

    def training_batch(
        self, inputs: tuple[Any, Any]
    ) -> tuple[dict[str, tf.Tensor], tf.Tensor, tf.Tensor]:
        """`(x, labels, sample_weight)` for teacher forcing on `(sources, targets)`."""
        if not isinstance(inputs, tuple) or len(inputs) != 2:
            raise ValueError(
                "`training_batch` takes a (sources, targets) pair of string batches. "
                f"Received: {type(inputs).__name__}"
            )
        sources, targets = inputs
        tokenizer = self.target_tokenizer or self.tokenizer
        labels = tf.cast(self.target_packer(tokenizer(targets)), tf.int32)
        start = tf.fill([tf.shape(labels)[0], 1], tf.constant(self.decoder_start_token_id))
        x = {
            **self.call(sources),
            "decoder_token_ids": tf.concat([start, labels[:, :-1]], axis=1),
        }
        weights = tf.cast(tf.not_equal(labels, self.packer.pad_value), tf.float32)
        return x, labels, weights

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "tokenizer": keras.saving.serialize_keras_object(self.tokenizer),
            "packer": keras.saving.serialize_keras_object(self.packer),
            "decoder_start_token_id": self.decoder_start_token_id,
            "decoder_sequence_length": self.decoder_sequence_length,
            "target_tokenizer": keras.saving.serialize_keras_object(self.target_tokenizer),
        }

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Self:
        config = dict(config)
        for key in ("tokenizer", "packer", "target_tokenizer"):
            if config.get(key) is not None:
                config[key] = keras.saving.deserialize_keras_object(config[key])
        return cls(**config)
