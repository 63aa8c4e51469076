"""Character-level tokenization: one token per Unicode code point (the classic baseline)."""

from collections.abc import Sequence
from typing import Any

import keras
import tensorflow as tf
import tensorflow_text as tf_text

from keras_attn.tokenizers.base import SPECIAL_TOKENS, Tokenizer


@keras.saving.register_keras_serializable(package="keras_attn")
class UnicodeCharTokenizer(Tokenizer):
    """Strings to code points, shifted past the special tokens: `id = code point + S`.

    Code points that do not fit in `vocabulary_size` become `[UNK]`; invalid UTF-8 bytes
    become U+FFFD (the replacement character) before that.

    Args:
        vocabulary_size: int. Ids in `[0, vocabulary_size)`. Defaults to covering the Basic
            Multilingual Plane (65,536 code points); pass `128 + S` for ASCII only.
        lowercase: bool. Lower-case first. Defaults to `False`.
        normalization_form: optional `"NFC"`, `"NFKC"`, `"NFD"`, `"NFKD"`, applied first.
        sequence_length, special_tokens: see `Tokenizer`.
    """

    def __init__(
        self,
        vocabulary_size: int | None = None,
        lowercase: bool = False,
        normalization_form: str | None = None,
        sequence_length: int | None = None,
        special_tokens: Sequence[str] = SPECIAL_TOKENS,
        **kwargs: Any,
    ) -> None:
        super().__init__(sequence_length=sequence_length, special_tokens=special_tokens, **kwargs)
        self._offset = len(self.special_tokens)
        if vocabulary_size is None:
            vocabulary_size = 65536 + self._offset
        if not isinstance(vocabulary_size, int) or vocabulary_size <= self._offset:
            raise ValueError(
                f"`vocabulary_size` must be an integer above the {self._offset} special tokens. "
                f"Received: vocabulary_size={vocabulary_size!r}"
            )
        if normalization_form not in (None, "NFC", "NFKC", "NFD", "NFKD"):
            raise ValueError(
                "`normalization_form` must be None, 'NFC', 'NFKC', 'NFD' or 'NFKD'. "
                f"Received: normalization_form={normalization_form!r}"
            )
        if "[UNK]" not in self.special_tokens:
            raise ValueError(f"`special_tokens` must include '[UNK]'. Received: {special_tokens}")
        self._vocabulary_size = vocabulary_size
        self.lowercase = lowercase
        self.normalization_form = normalization_form

    def vocabulary_size(self) -> int:
        return self._vocabulary_size

    def id_to_token(self, token_id: int) -> str:
        token_id = self._check_id(token_id)
        if token_id < self._offset:
            return self.special_tokens[token_id]
        return chr(token_id - self._offset)

    def token_to_id(self, token: str) -> int:
        if token in self.special_tokens:
            return self.special_tokens.index(token)
        if not isinstance(token, str) or len(token) != 1:
            raise ValueError(
                f"`token` must be one character or a special token. Received: {token!r}"
            )
        token_id = ord(token) + self._offset
        return token_id if token_id < self._vocabulary_size else self.special_token_id("[UNK]")

    def _tokenize(self, strings):
        if self.normalization_form is not None:
            strings = tf_text.normalize_utf8(strings, self.normalization_form)
        if self.lowercase:
            strings = tf.strings.lower(strings, encoding="utf-8")
        codepoints = tf.strings.unicode_decode(
            strings, "UTF-8", errors="replace", replacement_char=0xFFFD
        )
        unk = self.special_token_id("[UNK]")
        size = self._vocabulary_size

        def to_ids(values: tf.Tensor) -> tf.Tensor:
            values = values + self._offset
            return tf.where(values < size, values, tf.fill(tf.shape(values), unk))

        return tf.ragged.map_flat_values(to_ids, codepoints)

    def _detokenize(self, ids):
        return tf.strings.unicode_encode(ids - self._offset, "UTF-8", errors="replace")

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "vocabulary_size": self._vocabulary_size,
            "lowercase": self.lowercase,
            "normalization_form": self.normalization_form,
        }
