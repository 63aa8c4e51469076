"""Byte-pair encoding (BPE) from the files users have: GPT-2/RoBERTa `vocab.json` + `merges.txt`,
or a Hugging Face `tokenizer.json` (GPT-2, RoBERTa, Llama 3, Qwen2: byte-level; Llama 2,
Mistral, TinyLlama: SentencePiece-style with byte fallback), run in the TensorFlow graph.

`vocab.json` + `merges.txt` are written as the `tokenizer.json` they stand for; the graph ops
are in `keras_attn.tokenizers.bpe_ops`, the shared pipeline in `keras_attn.tokenizers.pipeline`.
"""

import os
from collections.abc import Mapping, Sequence
from typing import Any, Self

import keras
import tensorflow as tf

from keras_attn.tokenizers import bpe_ops
from keras_attn.tokenizers.json_plan import Plan
from keras_attn.tokenizers.pipeline import TOKENIZER_FILE, JsonTokenizer, read_json_file

GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_PATTERN = LLAMA3_PATTERN.replace(r"\p{N}{1,3}", r"\p{N}")
PATTERNS = {"gpt2": GPT2_PATTERN, "llama3": LLAMA3_PATTERN, "qwen2": QWEN2_PATTERN}


def tokenizer_json(
    vocabulary: Mapping[str, int],
    merges: Sequence[str | Sequence[str]],
    pattern: str = "gpt2",
    add_prefix_space: bool = False,
    special_tokens: Sequence[str] = (),
    unknown_token: str | None = None,
) -> dict[str, Any]:
    """A byte-level BPE `tokenizer.json` (Hugging Face format) from a vocabulary and merges."""
    regex = PATTERNS.get(pattern, pattern)
    byte_level = {"type": "ByteLevel", "add_prefix_space": add_prefix_space,
                  "trim_offsets": True, "use_regex": pattern == "gpt2"}  # fmt: skip
    pre_tokenizer = byte_level if pattern == "gpt2" else {
        "type": "Sequence",
        "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated",
             "invert": False},
            byte_level,
        ],
    }  # fmt: skip
    missing = [t for t in special_tokens if t not in vocabulary]
    if missing:
        raise ValueError(f"`special_tokens` {missing} are not in the `vocabulary`.")
    pairs = [m.split(" ") if isinstance(m, str) else list(m) for m in merges]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": int(vocabulary[t]),
                "content": t,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for t in special_tokens
        ],
        "normalizer": None,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": None,
        "decoder": {
            "type": "ByteLevel",
            "add_prefix_space": True,
            "trim_offsets": True,
            "use_regex": True,
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": unknown_token,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {str(t): int(i) for t, i in vocabulary.items()},
            "merges": pairs,
        },
    }


def read_merges(path: str | os.PathLike[str]) -> list[str]:
    """`merges.txt` (GPT-2's format: an optional `#version` line, then `left right` lines)."""
    if not os.path.exists(path):
        raise ValueError(f"`merges` path does not exist. Received: merges={str(path)!r}")
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    return [line for line in lines if line and not line.startswith("#version")]


@keras.saving.register_keras_serializable(package="keras_attn")
class BytePairTokenizer(JsonTokenizer):
    """Strings to byte-pair (BPE) ids and back, in the TensorFlow graph, as `tokenizers` does.

    Byte-level BPE (GPT-2, RoBERTa, Llama 3, Qwen2) writes each UTF-8 byte as a character,
    splits text into words with a regular expression (`pattern`), and merges adjacent
    symbols of each word in the order of `merges`. `from_tokenizer_json` also reads the
    SentencePiece-style BPE of Llama 2 and Mistral (`▁` for spaces, bytes as `<0xNN>` for
    characters outside the vocabulary). Ids equal the `tokenizers` library's on every line of
    a 10,000-line differential (tested).

    Args:
        vocabulary: `{token: id}`, or the path of a `vocab.json`.
        merges: `"left right"` strings or `(left, right)` pairs, highest priority first, or
            the path of a `merges.txt`.
        pattern: `"gpt2"` (GPT-2, RoBERTa), `"llama3"`, `"qwen2"`, or a `tokenizers`
            pre-tokenizing regular expression.
        add_prefix_space: bool. Put a space before text that does not start with one (RoBERTa
            does for single words).
        special_tokens: tokens of the vocabulary matched whole in text (e.g.
            `"<|endoftext|>"`) and dropped by `detokenize`.
        unknown_token: optional token for symbols outside the vocabulary.
        sequence_length: optional int: dense `(batch, sequence_length)` output padded with 0.
    Example:
        >>> vocabulary = {"a": 0, "b": 1, "Ġ": 2, "ab": 3, "Ġab": 4}
        >>> tok = BytePairTokenizer(vocabulary, ["a b", "Ġ ab"])
        >>> tok.tokenize(["ab ab"]).to_list()
        [[3, 4]]
    """

    MODEL = "BPE"

    def __init__(
        self,
        vocabulary: Mapping[str, int] | str | None = None,
        merges: Sequence[str | Sequence[str]] | str | None = None,
        pattern: str = "gpt2",
        add_prefix_space: bool = False,
        special_tokens: Sequence[str] | None = None,
        unknown_token: str | None = None,
        sequence_length: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(sequence_length=sequence_length, special_tokens=special_tokens, **kwargs)
        self.pattern = pattern
        self.add_prefix_space = add_prefix_space
        self.unknown_token = unknown_token
        if (vocabulary is None) != (merges is None):
            raise ValueError(
                "Pass both `vocabulary` and `merges`, or neither (then use "
                f"`from_tokenizer_json`). Received: vocabulary is None: {vocabulary is None}, "
                f"merges is None: {merges is None}"
            )
        if vocabulary is not None:
            if isinstance(vocabulary, str | os.PathLike):
                vocabulary = read_json_file(vocabulary, "vocabulary")
            if isinstance(merges, str | os.PathLike):
                merges = read_merges(merges)
            spec = tokenizer_json(
                vocabulary,  # type: ignore[arg-type]  # a mapping once read
                merges,  # type: ignore[arg-type]
                pattern,
                add_prefix_space,
                special_tokens or (),
                unknown_token,
            )
            self.set_tokenizer_json(spec)

    @classmethod
    def from_pretrained(cls, folder: str | os.PathLike[str], **kwargs: Any) -> Self:
        """The tokenizer of a Hugging Face folder: `tokenizer.json`, else `vocab.json` +
        `merges.txt` (GPT-2's pattern; `<|endoftext|>` special when the vocabulary has it)."""
        folder = os.fspath(folder)
        if os.path.exists(os.path.join(folder, TOKENIZER_FILE)):
            return cls.from_tokenizer_json(os.path.join(folder, TOKENIZER_FILE), **kwargs)
        vocabulary = read_json_file(os.path.join(folder, "vocab.json"), "folder")
        specials = [t for t in ("<|endoftext|>",) if t in vocabulary]
        return cls(vocabulary, os.path.join(folder, "merges.txt"),
                   **{"special_tokens": specials, **kwargs})  # fmt: skip

    def _build_model(self, plan: Plan) -> None:
        merges = [f"{a} {b}" for a, b in plan.merges]
        self._ranks = string_table_ranks(merges)
        self._bytes = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(
                tf.constant([bytes([b]) for b in range(256)]),
                tf.constant(bpe_ops.byte_alphabet()),
            ),
            "",
        )
        self._fallback = tf.constant([f"<0x{b:02X}>" for b in range(256)])

    def _encode_words(self, words):
        plan = self._plan
        if plan.byte_level:
            symbols = tf.ragged.map_flat_values(self._bytes.lookup, tf.strings.bytes_split(words))
        else:
            symbols = self._characters(words)
        if plan.ignore_merges:
            whole = tf.strings.reduce_join(symbols, axis=1)
            known = self._ids.lookup(whole) >= 0
            symbols = _choose(known, tf.RaggedTensor.from_tensor(whole[:, tf.newaxis]), symbols)
        symbols = bpe_ops.merge_pairs(symbols, self._ranks)
        ids = tf.ragged.map_flat_values(self._ids.lookup, symbols)
        if plan.unknown_id is not None:
            ids = tf.ragged.map_flat_values(lambda x: tf.where(x < 0, plan.unknown_id, x), ids)
        return tf.ragged.boolean_mask(ids, ids >= 0)

    def _characters(self, words):
        """SentencePiece-style first symbols: characters, those outside the vocabulary as
        their `<0xNN>` bytes (byte fallback) or the unknown token (fused when `fuse_unk`)."""
        plan = self._plan
        chars = tf.strings.unicode_split(words, "UTF-8", errors="replace")
        flat = chars.flat_values
        known = self._ids.lookup(flat) >= 0
        if plan.byte_fallback:
            as_bytes = tf.strings.bytes_split(flat)
            codes = tf.ragged.map_flat_values(
                lambda b: tf.cast(tf.io.decode_raw(b, tf.uint8)[:, 0], tf.int32), as_bytes
            )
            fallback = tf.ragged.map_flat_values(lambda c: tf.gather(self._fallback, c), codes)
            per_char = _choose(known, tf.RaggedTensor.from_tensor(flat[:, tf.newaxis]), fallback)
            return tf.RaggedTensor.from_row_splits(per_char, chars.row_splits).merge_dims(1, 2)
        if plan.unknown_token is None:
            return chars
        flat = tf.where(known, flat, plan.unknown_token)
        if plan.fuse_unk:
            unknown = ~known
            index = tf.range(tf.size(flat, out_type=tf.int64))
            first = index == tf.gather(chars.row_splits, chars.value_rowids())
            repeated = unknown & tf.concat([[False], unknown[:-1]], axis=0) & ~first
            kept = tf.ragged.boolean_mask(chars.with_flat_values(flat),
                                          chars.with_flat_values(~repeated))  # fmt: skip
            return kept
        return chars.with_flat_values(flat)

    def get_config(self) -> dict[str, Any]:
        # The vocabulary and merges travel as `tokenizer.json` in `.keras` archives.
        return {
            **super().get_config(),
            "vocabulary": None,
            "merges": None,
            "special_tokens": None,
            "pattern": self.pattern,
            "add_prefix_space": self.add_prefix_space,
            "unknown_token": self.unknown_token,
        }


def string_table_ranks(merges: list[str]) -> tf.lookup.StaticHashTable:
    """`"left right"` to the merge's rank (`bpe_ops.NO_RANK` for pairs that never merge)."""
    return tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(
            tf.constant(merges or [""], tf.string),
            tf.constant(list(range(len(merges))) or [bpe_ops.NO_RANK], tf.int32),
        ),
        bpe_ops.NO_RANK,
    )


def _choose(condition, when_true, when_false):
    """Row `i` of `when_true` where `condition[i]`, else of `when_false` (ragged rows)."""
    count = tf.size(condition, out_type=tf.int64)
    index = tf.where(condition, tf.range(count), count + tf.range(count))
    return tf.gather(tf.concat([when_true, when_false], axis=0), index)
