"""Marian's tokenizer pair (`source.spm`, `target.spm`, `vocab.json`), in the TensorFlow graph,
as `transformers`' `MarianTokenizer` runs it.

SentencePiece (tensorflow-text's op: the same library `transformers` calls) cuts the text into
pieces, and `vocab.json` numbers them: the two do not share ids, and a piece the vocabulary
lacks is `<unk>`. The special tokens (`</s>`, `<unk>`, `<pad>`) are split out of the text
first; a chunk that starts with a language code (`>>fr<<`) keeps it as one token. Decoding
joins the pieces (`▁` is a space), as `MarianTokenizer.decode` does.
"""

import json
import os
from collections.abc import Sequence
from typing import Any

import keras
import tensorflow as tf
import tensorflow_text as tf_text

from keras_attn.tokenizers import bpe_ops
from keras_attn.tokenizers.base import Tokenizer
from keras_attn.tokenizers.pipeline import read_folder_json

FILES = ("source.spm", "target.spm", "vocab.json")
MARIAN_SPECIAL_TOKENS = ("</s>", "<unk>", "<pad>")
MAX_FILE_BYTES = 64 << 20
# Python's str.strip() whitespace (MarianTokenizer strips its decoded text).
STRIP = r"^[\t-\r\x{1c}-\x{20}\x{85}\x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}\x{205f}\x{3000}]+|[\t-\r\x{1c}-\x{20}\x{85}\x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}\x{205f}\x{3000}]+$"  # noqa: E501


@keras.saving.register_keras_serializable(package="keras_attn")
class MarianTokenizer(Tokenizer):
    """Strings to Marian ids and back (`MarianTokenizer.from_pretrained(folder)`).

    Ids equal `transformers.MarianTokenizer`'s on real text, language codes and special
    tokens in the text included; on runs of three or more equal characters the SentencePiece
    inside tensorflow-text may break ties between equal segmentations otherwise (tested:
    every generated line without such a run agrees; the server's reader agrees on all). The
    target side is for labels; decoding is the same for both.

    Args:
        source: bytes of `source.spm` (or its path).
        target: bytes of `target.spm` (or its path).
        vocabulary: `vocab.json`'s `{piece: id}`.
        sequence_length: optional int: dense output padded with 0 (Marian's pad id is not 0:
            use a packer to pad with it).
        side: `"source"` (default) or `"target"`: the model that cuts the text.
    """

    def __init__(
        self,
        source: bytes | str | None = None,
        target: bytes | str | None = None,
        vocabulary: dict[str, int] | None = None,
        sequence_length: int | None = None,
        side: str = "source",
        special_tokens: Sequence[str] = MARIAN_SPECIAL_TOKENS,
        **kwargs: Any,
    ) -> None:
        super().__init__(sequence_length=sequence_length, special_tokens=special_tokens, **kwargs)
        if side not in ("source", "target"):
            raise ValueError(f"`side` must be 'source' or 'target'. Received: side={side!r}")
        self.side = side
        given = [x is not None for x in (source, target, vocabulary)]
        if any(given) and not all(given):
            raise ValueError("`source`, `target` and `vocabulary` must be given together")
        if all(given):
            self.set_files(source, target, vocabulary)  # type: ignore[arg-type]  # not None

    def _check_special_tokens(self, special_tokens):
        tokens = () if isinstance(special_tokens, str) else tuple(special_tokens)
        if not all(isinstance(t, str) and t for t in tokens) or len(set(tokens)) != len(tokens):
            raise ValueError(
                "`special_tokens` must be distinct non-empty strings. Received: "
                f"special_tokens={special_tokens!r:.80}"
            )
        if "<unk>" not in tokens:
            raise ValueError(f"`special_tokens` must include '<unk>'. Received: {tokens!r:.80}")
        return tokens

    @classmethod
    def from_pretrained(cls, folder: str | os.PathLike[str], **kwargs: Any) -> "MarianTokenizer":
        """The tokenizer of a Hugging Face Marian folder (`source.spm`, `target.spm`,
        `vocab.json`). A folder with separate source and target vocabularies is refused."""
        folder = os.fspath(folder)
        if read_folder_json(folder, "tokenizer_config.json").get("separate_vocabs"):
            raise ValueError("Marian folders with separate vocabularies are not supported")
        files = [_read(os.path.join(folder, name)) for name in FILES]
        vocabulary = _vocabulary(files[2])
        return cls(files[0], files[1], vocabulary, **kwargs)

    def set_files(self, source: bytes | str, target: bytes | str, vocabulary: Any) -> None:
        """Sets the two SentencePiece models and the vocabulary (checked)."""
        source, target = (_read(p) if isinstance(p, str) else p for p in (source, target))
        vocabulary = _vocabulary(vocabulary)
        missing = [t for t in self.special_tokens if t not in vocabulary]
        if missing:
            raise ValueError(f"`vocabulary` lacks the special tokens {missing}")
        try:
            models = [tf_text.SentencepieceTokenizer(model=m, out_type=tf.string)
                      for m in (source, target)]  # fmt: skip
            if min(int(m.vocab_size()) for m in models) <= 0:
                raise TypeError("an empty model")
        except (tf.errors.OpError, TypeError):
            raise ValueError("`source` and `target` must be SentencePiece model files") from None
        self._models, self._files = models, (source, target)
        self._vocabulary = vocabulary
        tokens = sorted(vocabulary, key=vocabulary.__getitem__)
        self._tokens = tokens
        unk = vocabulary["<unk>"]
        self._ids = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(tf.constant(tokens),
                                                tf.constant([vocabulary[t] for t in tokens])),
            unk,
        )  # fmt: skip
        self._pieces = tf.constant(tokens)
        escaped = [bpe_ops._re2_literal(t) for t in sorted(self.special_tokens, key=len)[::-1]]
        self._special_pattern = "|".join(escaped)
        self._reset_compiled()

    def _check_files(self):
        if "_vocabulary" not in self.__dict__:
            raise ValueError("The tokenizer has no files: use `MarianTokenizer.from_pretrained`.")

    def vocabulary_size(self) -> int:
        self._check_files()
        return max(self._vocabulary.values()) + 1

    def get_vocabulary(self) -> list[str]:
        """The tokens in id order."""
        self._check_files()
        return list(self._tokens)

    def id_to_token(self, token_id: int) -> str:
        self._check_files()
        return self._tokens[self._check_id(token_id)]

    def token_to_id(self, token: str) -> int:
        self._check_files()
        if token not in self._vocabulary:
            raise ValueError(f"`token` is not in the vocabulary. Received: token={token!r}")
        return self._vocabulary[token]

    def _tokenize(self, strings):
        self._check_files()
        chunks = bpe_ops.regex_pieces(strings, self._special_pattern)
        flat = chunks.flat_values
        special = tf.strings.regex_full_match(flat, self._special_pattern)
        # A chunk that starts with `>>code<<` keeps the code as one token.
        has_code = tf.strings.regex_full_match(flat, "(?s)>>.*?<<.*")
        code = tf.where(has_code, tf.strings.regex_replace(flat, "(?s)^(>>.*?<<).*$", r"\1"), "")
        start = tf.strings.length(code)
        rest = tf.strings.substr(flat, start, tf.strings.length(flat) - start)
        model = self._models[0 if self.side == "source" else 1]
        pieces = model.tokenize(tf.where(special, "", rest))
        heads = tf.where(special, flat, code)
        heads = tf.ragged.boolean_mask(heads[:, tf.newaxis], (heads != "")[:, tf.newaxis])
        tokens = tf.concat([heads, pieces], axis=1)
        ids = tf.ragged.map_flat_values(self._ids.lookup, tokens)
        return tf.RaggedTensor.from_row_splits(ids, chunks.row_splits).merge_dims(1, 2)

    def _detokenize(self, ids):
        pieces = tf.ragged.map_flat_values(lambda i: tf.gather(self._pieces, i), ids)
        text = tf.strings.reduce_join(pieces, axis=1)
        text = tf.strings.regex_replace(text, "\u2581", " ")
        return tf.strings.regex_replace(text, STRIP, "")

    def model_file(self, side: str = "source") -> bytes:
        """The SentencePiece model file (`source.spm` or `target.spm`) of `side`."""
        self._check_files()
        if side not in ("source", "target"):
            raise ValueError(f"`side` must be 'source' or 'target'. Received: side={side!r}")
        return self._files[side == "target"]

    def save_assets(self, dir_path: str) -> None:
        self._check_files()
        for name, data in zip(FILES[:2], self._files, strict=True):
            with open(os.path.join(dir_path, name), "wb") as f:
                f.write(data)
        with open(os.path.join(dir_path, FILES[2]), "w", encoding="utf-8") as f:
            json.dump(self._vocabulary, f, ensure_ascii=False)

    def load_assets(self, dir_path: str) -> None:
        self.set_files(*(_read(os.path.join(dir_path, name)) for name in FILES))

    def get_config(self) -> dict[str, Any]:
        # The models and vocabulary travel as asset files in `.keras` archives.
        return {**super().get_config(), "side": self.side}


def _read(path: str) -> bytes:
    if not os.path.isfile(path):
        raise ValueError(f"a Marian tokenizer needs {os.path.basename(path)!r}")
    size = os.path.getsize(path)
    if size > MAX_FILE_BYTES:
        raise ValueError(f"{os.path.basename(path)!r} has {size} bytes; at most {MAX_FILE_BYTES}")
    with open(path, "rb") as f:
        return f.read()


def _vocabulary(data: Any) -> dict[str, int]:
    """`vocab.json` (bytes or a dict) checked: string tokens, distinct ids in [0, 2**24)."""
    if isinstance(data, bytes):
        try:
            data = json.loads(data.decode("utf-8"))
        except ValueError:
            raise ValueError("vocab.json is not valid JSON") from None
    if not isinstance(data, dict) or not data:
        raise ValueError("vocab.json must map tokens to ids")
    ids = list(data.values())
    if not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 1 << 24 for i in ids):
        raise ValueError("vocab.json's ids must be integers in [0, 2**24)")
    if len(set(ids)) != len(ids) or max(ids) + 1 != len(ids):
        raise ValueError("vocab.json's ids must be distinct and numbered from 0 without gaps")
    return {str(k): v for k, v in data.items()}
