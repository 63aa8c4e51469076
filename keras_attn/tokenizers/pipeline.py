"""Base of the tokenizers that run a Hugging Face `tokenizer.json` in the TensorFlow graph.

A `JsonTokenizer` keeps the `tokenizer.json` it was built from: it travels as the `.keras`
asset and as the exported artifact's tokenizer, which the server runs with the `tokenizers`
library. Here, in order, as `tokenizers` does: added tokens are matched whole in the raw text;
the text between them is normalized and split into words (`json_plan`); the model turns each
distinct word into ids (`_encode_words`: BPE merges, or the Unigram lattice).
"""

import json
import os
from collections.abc import Iterable, Mapping
from typing import Any, Self

import tensorflow as tf

from keras_attn.tokenizers import bpe_ops
from keras_attn.tokenizers.base import Tokenizer
from keras_attn.tokenizers.json_plan import Plan, plan_of

TOKENIZER_FILE = "tokenizer.json"


def read_json_file(path: str | os.PathLike[str], argument: str) -> Any:
    if not os.path.exists(path):
        raise ValueError(f"`{argument}` path does not exist. Received: {argument}={str(path)!r}")
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def read_folder_json(folder: str | os.PathLike[str], name: str) -> dict[str, Any]:
    """A small JSON object file of the folder ({} when absent)."""
    path = os.path.join(folder, name)
    if not os.path.exists(path):
        return {}
    if os.path.getsize(path) > 1 << 20:
        raise ValueError(f"{name} has over 1 MiB; at most 1 MiB is read")
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (ValueError, UnicodeDecodeError):
        raise ValueError(f"{name} is not valid JSON") from None
    if not isinstance(config, dict):
        raise ValueError(f"{name} must hold a JSON object")
    return config


def string_table(
    keys: Iterable[str], values: Iterable[int], default: int
) -> tf.lookup.StaticHashTable:
    """A `tf.lookup.StaticHashTable` from strings to int32 (a placeholder key when empty)."""
    return tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(
            tf.constant(list(keys) or [""], tf.string),
            tf.constant(list(values) or [default], tf.int32),
        ),
        default,
    )


class JsonTokenizer(Tokenizer):
    """What `BytePairTokenizer` and `UnigramTokenizer` share: added tokens, normalizers,
    pre-tokenizers and decoders of a `tokenizer.json`, vocabulary lookups and saving.

    Subclasses set `MODEL` (`tokenizer.json`'s model type) and implement
    `_build_model(plan)` and `_encode_words(words (n,) strings) -> ragged ids`.
    """

    MODEL = ""

    def __init__(self, sequence_length: int | None = None, **kwargs: Any) -> None:
        special_tokens = kwargs.pop("special_tokens", None) or ()
        super().__init__(sequence_length=sequence_length, special_tokens=special_tokens, **kwargs)
        self._json: dict[str, Any] | None = None

    def _check_special_tokens(self, special_tokens):
        # Imported vocabularies name their own special tokens, at any id.
        return tuple(str(t) for t in special_tokens)

    @classmethod
    def from_tokenizer_json(
        cls, source: str | os.PathLike[str] | Mapping[str, Any], **kwargs: Any
    ) -> Self:
        """A tokenizer from a Hugging Face `tokenizer.json` (a path, or the parsed dict);
        `kwargs` go to the constructor (`sequence_length`)."""
        tokenizer = cls(**kwargs)
        spec = source if isinstance(source, Mapping) else read_json_file(source, "source")
        tokenizer.set_tokenizer_json(dict(spec))
        return tokenizer

    def set_tokenizer_json(self, spec: dict[str, Any]) -> None:
        """Sets everything from a `tokenizer.json` dict; unsupported parts (normalizers,
        pre-tokenizers, decoders, another model type) raise a `ValueError` naming them."""
        plan = plan_of(spec)
        if plan.kind != self.MODEL:
            raise ValueError(
                f"{type(self).__name__} runs {self.MODEL} models; this tokenizer.json has a "
                f"{plan.kind} model (use `keras_attn.tokenizers.from_tokenizer_json`, which "
                "picks the class)."
            )
        self._reset_compiled()
        self._json = spec
        self._plan = plan
        self.special_tokens = tuple(plan.special_tokens)
        self._ids = string_table(plan.vocabulary, plan.vocabulary.values(), -1)
        self._added_ids = string_table(plan.added, plan.added.values(), -1)
        self._decoded = tf.constant(plan.decoded)  # the bytes each id decodes to
        self._decoded_first = tf.constant(plan.decoded_first)  # ... as a text's first token
        self._build_model(plan)

    def _build_model(self, plan: Plan) -> None:
        raise NotImplementedError

    def _encode_words(self, words: tf.Tensor) -> tf.RaggedTensor:
        raise NotImplementedError

    def _check_json(self):
        if self._json is None:
            raise ValueError(
                "The tokenizer has no vocabulary. Use `from_tokenizer_json` or "
                "`from_pretrained` (or pass the vocabulary to the constructor)."
            )

    def get_tokenizer_json(self) -> dict[str, Any]:
        """The Hugging Face `tokenizer.json` this tokenizer runs (what the server loads)."""
        self._check_json()
        return json.loads(json.dumps(self._json))

    def get_vocabulary(self) -> list[str]:
        self._check_json()
        return list(self._plan.tokens)

    def vocabulary_size(self) -> int:
        self._check_json()
        return len(self._plan.tokens)

    def id_to_token(self, token_id: int) -> str:
        return self.get_vocabulary()[self._check_id(token_id)]

    def token_to_id(self, token: str) -> int:
        self._check_json()
        index = self._plan.added.get(token, self._plan.vocabulary.get(token))
        if index is None:
            raise ValueError(f"`token` is not in the vocabulary. Received: token={token!r}")
        return index

    # Tokenization ------------------------------------------------------------------------
    def _tokenize(self, strings):
        self._check_json()
        plan = self._plan
        if plan.added_pattern is not None:
            segments = bpe_ops.regex_pieces(strings, plan.added_pattern)
        else:
            segments = tf.RaggedTensor.from_tensor(strings[:, tf.newaxis])
        flat = segments.flat_values
        first = tf.range(tf.size(flat, out_type=tf.int64)) == tf.gather(
            segments.row_splits, segments.value_rowids()
        )
        added_ids = (
            self._added_ids.lookup(_strip_whitespace(flat)) if plan.strip_added
            else self._added_ids.lookup(flat)
        ) if plan.added else tf.fill(tf.shape(flat), -1)  # fmt: skip
        is_added = added_ids >= 0
        text_rows = tf.reshape(tf.where(~is_added), [-1])
        added_rows = tf.reshape(tf.where(is_added), [-1])
        text_ids = self._encode_text(tf.gather(flat, text_rows), tf.gather(first, text_rows))
        added = tf.RaggedTensor.from_tensor(tf.gather(added_ids, added_rows)[:, tf.newaxis])
        order = tf.concat([text_rows, added_rows], axis=0)
        merged = tf.concat([text_ids, added], axis=0)
        per_segment = tf.gather(merged, tf.math.invert_permutation(order))
        return tf.RaggedTensor.from_row_splits(per_segment, segments.row_splits).merge_dims(1, 2)

    def _encode_text(self, texts, first):
        """Ragged ids of text segments (no added tokens in them): each distinct word once."""
        words = self._plan.pre_tokenize(self._plan.normalize(texts), first)
        unique, where = tf.unique(words.flat_values)
        per_word = tf.gather(self._encode_words(unique), where)
        return tf.RaggedTensor.from_row_splits(per_word, words.row_splits).merge_dims(1, 2)

    def _detokenize(self, ids):
        first = tf.strings.reduce_join(tf.gather(self._decoded_first, ids[:, :1]), axis=-1)
        rest = tf.strings.reduce_join(tf.gather(self._decoded, ids[:, 1:]), axis=-1)
        text = first + rest
        if self._plan.strip_leading_space:
            text = tf.strings.regex_replace(text, "^ ", "")
        return tf.strings.unicode_transcode(
            text, "UTF-8", "UTF-8", errors="replace", replacement_char=0xFFFD
        )

    # Saving ------------------------------------------------------------------------------
    def save_assets(self, dir_path: str) -> None:
        with open(os.path.join(dir_path, TOKENIZER_FILE), "w", encoding="utf-8") as f:
            json.dump(self.get_tokenizer_json(), f, ensure_ascii=False)

    def load_assets(self, dir_path: str) -> None:
        self.set_tokenizer_json(read_json_file(os.path.join(dir_path, TOKENIZER_FILE), "asset"))


def _strip_whitespace(strings):
    edges = f"^[{bpe_ops.WHITESPACE}]+|[{bpe_ops.WHITESPACE}]+$"
    return tf.strings.regex_replace(strings, edges, "")
