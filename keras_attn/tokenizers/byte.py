"""Byte-level tokenization: every UTF-8 byte is a token; no vocabulary to learn, nothing unknown."""

from collections.abc import Sequence
from typing import Any

import keras
import tensorflow as tf

from keras_attn.tokenizers.base import SPECIAL_TOKENS, Tokenizer


@keras.saving.register_keras_serializable(package="keras_attn")
class ByteTokenizer(Tokenizer):
    """Strings to their UTF-8 bytes, shifted past the special tokens: `id = byte + S`.

    Any byte string round-trips exactly, including invalid UTF-8.

    Args:
        lowercase: bool. Lower-case (Unicode-aware) before encoding. Defaults to `False`.
        sequence_length, special_tokens: see `Tokenizer`.
    Example:
        >>> ByteTokenizer().tokenize("hi").numpy().tolist()  # [104 + 7, 105 + 7]
        [111, 112]
    """

    def __init__(
        self,
        lowercase: bool = False,
        sequence_length: int | None = None,
        special_tokens: Sequence[str] = SPECIAL_TOKENS,
        **kwargs: Any,
    ) -> None:
        super().__init__(sequence_length=sequence_length, special_tokens=special_tokens, **kwargs)
        self.lowercase = lowercase
        self._offset = len(self.special_tokens)
        self._bytes = tf.constant([bytes([b]) for b in range(256)])

    def vocabulary_size(self) -> int:
        return 256 + self._offset

    def id_to_token(self, token_id: int) -> str | bytes:
        token_id = self._check_id(token_id)
        if token_id < self._offset:
            return self.special_tokens[token_id]
        return bytes([token_id - self._offset])

    def token_to_id(self, token: str | bytes) -> int:
        if token in self.special_tokens:
            return self.special_tokens.index(token)
        if isinstance(token, str):
            token = token.encode("utf-8")
        if not isinstance(token, bytes) or len(token) != 1:
            raise ValueError(f"`token` must be one byte or a special token. Received: {token!r}")
        return token[0] + self._offset

    def _tokenize(self, strings):
        if self.lowercase:
            strings = tf.strings.lower(strings, encoding="utf-8")
        ids = tf.strings.bytes_split(strings)
        values = tf.strings.unicode_decode(ids.flat_values, "ISO-8859-1")  # byte -> 0..255
        values = tf.cast(values.flat_values, tf.int32) + self._offset
        return ids.with_flat_values(values)

    def _detokenize(self, ids):
        pieces = tf.gather(self._bytes, ids - self._offset)
        return tf.strings.reduce_join(pieces, axis=-1)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "lowercase": self.lowercase}
