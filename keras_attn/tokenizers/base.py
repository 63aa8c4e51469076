"""What every tokenizer here shares: string inputs, dense or ragged ids, special tokens.

Tokenizers run TensorFlow ops (tensorflow-text), like keras-hub's: in `tf.data` pipelines and
SavedModel graphs. Called on anything but a symbolic Keras input they run those ops directly,
so `dataset.map(tokenizer)` works under every Keras backend; inside a functional model (TF
backend) they are ordinary layers.
"""

import os
from collections.abc import Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from keras_attn.preprocessing.base import PreprocessingLayer
from keras_attn.types import Tensor

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[BOS]", "[EOS]")
MAX_SHARDS = 4


def check_special_tokens(special_tokens: Sequence[str]) -> tuple[str, ...]:
    if not special_tokens or special_tokens[0] != "[PAD]":
        raise ValueError(
            "`special_tokens` must start with '[PAD]' (id 0 is padding). "
            f"Received: special_tokens={special_tokens!r}"
        )
    if len(set(special_tokens)) != len(special_tokens):
        raise ValueError(f"`special_tokens` has duplicates. Received: {special_tokens!r}")
    return tuple(special_tokens)


class Tokenizer(PreprocessingLayer):
    """Base class: subclasses implement `_tokenize(strings (batch,)) -> ragged int32` and
    `_detokenize(ragged ids without special tokens) -> strings (batch,)`, and the vocabulary
    methods `vocabulary_size`, `id_to_token`, `token_to_id`.

    Awkward input, for every tokenizer: empty strings give no ids; strings of any length (1 MB
    and more) are fine; invalid UTF-8 bytes become `[UNK]` (WordPiece: the word holding them;
    `ByteTokenizer` keeps the bytes, `UnicodeCharTokenizer` maps them to U+FFFD); ids out of
    range in `detokenize` raise a `ValueError`.

    Args:
        sequence_length: optional int. Dense `(batch, sequence_length)` output, truncated and
            padded with 0; otherwise ragged.
        special_tokens: tokens with the lowest ids, in order; the first must be `[PAD]`.
    """

    def __init__(
        self,
        sequence_length: int | None = None,
        special_tokens: Sequence[str] = SPECIAL_TOKENS,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if sequence_length is not None and (
            not isinstance(sequence_length, int) or sequence_length <= 0
        ):
            raise ValueError(
                "`sequence_length` must be a positive integer or None. "
                f"Received: sequence_length={sequence_length!r}"
            )
        self.sequence_length = sequence_length
        self.special_tokens = self._check_special_tokens(special_tokens)

    def _check_special_tokens(self, special_tokens: Sequence[str]) -> tuple[str, ...]:
        # Our own vocabularies put `[PAD]` at id 0; imported ones (BytePairTokenizer) differ.
        return check_special_tokens(special_tokens)

    # Calling -----------------------------------------------------------------------------
    def tokenize(self, inputs: str | Sequence[str] | Tensor) -> tf.Tensor | tf.RaggedTensor:
        """Strings (`str`, list, NumPy or tensor; scalar or `(batch,)`) to int32 ids."""
        return self(inputs)

    def call(self, inputs: Any) -> tf.Tensor | tf.RaggedTensor:
        inputs = tf.convert_to_tensor(inputs) if not tf.is_tensor(inputs) else inputs
        if inputs.dtype != tf.string:
            raise ValueError(f"`inputs` must be strings. Received: dtype={inputs.dtype.name}")
        if inputs.shape.rank not in (0, 1, None):
            raise ValueError(
                f"`inputs` must be a string or a (batch,) string tensor. "
                f"Received: shape={inputs.shape}"
            )
        scalar = inputs.shape.rank == 0
        strings = tf.reshape(inputs, [-1]) if scalar else inputs
        # Eagerly, a dozen small ops per call cost more in dispatch than in work: run them
        # as one compiled graph instead (about 2x faster on batches of 1,024 lines).
        ids = (
            self._compiled_tokenize(strings) if tf.executing_eagerly() else self._tokenize(strings)
        )
        if self.sequence_length is not None:
            ids = ids[:, : self.sequence_length].to_tensor(
                default_value=0, shape=(None, self.sequence_length)
            )
        return ids[0] if scalar else ids

    def _sharded_tokenize(self, strings):
        """`_tokenize` on one slice of the batch per core, concatenated.

        tensorflow-text's ops are single-threaded; independent slices run in parallel on
        TensorFlow's inter-op threads (~1.5x on this project's 2-core machines).
        """
        shards = min(os.cpu_count() or 1, MAX_SHARDS)
        if shards == 1:
            return self._tokenize(strings)
        total = tf.shape(strings)[0]
        bounds = [total * i // shards for i in range(shards + 1)]
        parts = [self._tokenize(strings[bounds[i] : bounds[i + 1]]) for i in range(shards)]
        return tf.concat(parts, axis=0)

    def _compiled_tokenize(self, strings):
        compiled = self.__dict__.get("_compiled")
        if compiled is None:
            compiled = tf.function(
                self._sharded_tokenize, input_signature=[tf.TensorSpec([None], tf.string)]
            )
            self._reset_compiled(compiled)
        return compiled(strings)

    def _reset_compiled(self, compiled=None):
        # Kept out of Keras's and TensorFlow's attribute tracking: it is a cache, not state.
        object.__setattr__(self, "_compiled", compiled)

    def compute_output_spec(self, inputs: keras.KerasTensor) -> keras.KerasTensor:
        shape = (inputs.shape[0], self.sequence_length) if len(inputs.shape) else (None,)
        return keras.KerasTensor(shape, dtype="int32", ragged=self.sequence_length is None)

    # Detokenizing ------------------------------------------------------------------------
    def detokenize(self, ids: Sequence[Any] | Tensor | tf.RaggedTensor) -> tf.Tensor:
        """Ids `(len,)` or `(batch, len)` (dense padded with 0, or ragged) to text.

        Special tokens (padding included) are dropped. Ids outside the vocabulary raise a
        `ValueError` naming the range.
        """
        ids = ids if isinstance(ids, tf.RaggedTensor) else tf.convert_to_tensor(ids, tf.int32)
        flat = np.asarray(ids.flat_values if isinstance(ids, tf.RaggedTensor) else ids)
        size = self.vocabulary_size()
        if flat.size and (flat.min() < 0 or flat.max() >= size):
            raise ValueError(
                f"`ids` must be in [0, {size}). Received ids in [{flat.min()}, {flat.max()}]"
            )
        scalar = ids.shape.rank == 1
        if scalar:
            ids = ids[tf.newaxis]
        if not isinstance(ids, tf.RaggedTensor):
            ids = tf.RaggedTensor.from_tensor(ids)
        is_special = tf.constant(self._special_id_mask())
        ids = tf.ragged.boolean_mask(ids, ~tf.gather(is_special, ids))
        text = self._detokenize(tf.cast(ids, tf.int32))
        return text[0] if scalar else text

    # Vocabulary --------------------------------------------------------------------------
    def special_token_id(self, token: str) -> int:
        """Id of a special token, e.g. `special_token_id("[EOS]")`."""
        if token not in self.special_tokens:
            raise ValueError(
                f"`token` is not a special token {self.special_tokens}. Received: {token!r}"
            )
        return self.token_to_id(token)

    def _special_id_mask(self):
        """bool list over the vocabulary: True at the ids of special tokens."""
        mask = [False] * self.vocabulary_size()
        for token in self.special_tokens:
            mask[self.token_to_id(token)] = True
        return mask

    def _check_id(self, token_id):
        if not 0 <= int(token_id) < self.vocabulary_size():
            raise ValueError(
                f"`token_id` must be in [0, {self.vocabulary_size()}). Received: {token_id}"
            )
        return int(token_id)

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "sequence_length": self.sequence_length,
            "special_tokens": list(self.special_tokens),
        }
