"""WordPiece tokenization on tensorflow-text, with BERT normalization and vocabulary training.

Runs in the TensorFlow graph (`tf.data`, SavedModel). Ids of the special tokens are fixed by
their order in the vocabulary: `[PAD]` is always 0, the padding id the models mask.
"""

import os
from collections.abc import Iterable, Sequence
from typing import Any, Self

import keras
import tensorflow as tf
import tensorflow_text as tf_text

from keras_attn.tokenizers.base import SPECIAL_TOKENS, Tokenizer

VOCABULARY_FILE = "vocabulary.txt"


def bert_normalize(strings: tf.Tensor, lowercase: bool = True) -> tf.Tensor:
    """BERT's text normalization, in the reference implementation's order, as graph ops.

    1. Clean: whitespace characters become a space; control and format characters, U+0000
       and U+FFFD are removed.
    2. When `lowercase` (BERT uncased): NFD, drop combining marks (accents), then lower-case.

    tensorflow-text's built-in option (`lower_case_nfd_strip_accents`) case-folds with NFKC
    instead, which changes `…`, `ß`, `½`, ligatures and drops `´`; doing the steps here keeps
    our ids equal to BERT's reference tokenizers.
    """
    # Control characters (Cc, written as ranges to keep \t \n \r: RE2 has no class
    # subtraction), format and private-use characters, U+0000 and U+FFFD are removed; then
    # every whitespace character becomes a space. (RE2 has no \p{Cn}: unassigned code points
    # are kept, where the reference drops them.)
    strings = tf.strings.regex_replace(
        strings, r"[\x00-\x08\x0B\x0C\x0E-\x1F\x7F-\x9F\p{Cf}\p{Co}\x{FFFD}]", ""
    )
    strings = tf.strings.regex_replace(strings, r"[\t\n\r\p{Zs}\x{2028}\x{2029}]", " ")
    if lowercase:
        strings = tf_text.normalize_utf8(strings, "NFD")
        strings = tf.strings.regex_replace(strings, r"\p{Mn}", "")
        strings = tf.strings.lower(strings, encoding="utf-8")
    return strings


def _as_dataset(data):
    if isinstance(data, tf.data.Dataset):
        return data
    if isinstance(data, str):
        raise ValueError(
            "`data` must be an iterable of strings or a tf.data.Dataset, not one string. "
            f"Received: data={data[:40]!r}…"
        )
    return tf.data.Dataset.from_tensor_slices(tf.constant(list(data), tf.string))


def train_wordpiece_vocabulary(
    data: Iterable[str] | tf.data.Dataset,
    vocabulary_size: int,
    lowercase: bool = True,
    special_tokens: Sequence[str] = SPECIAL_TOKENS,
    batch_size: int = 1024,
) -> list[str]:
    """Learns a WordPiece vocabulary with tensorflow-text's BERT vocabulary learner.

    Args:
        data: an iterable of strings, or a `tf.data.Dataset` of string scalars or batches.
        vocabulary_size: int. Upper bound on the vocabulary size, special tokens included.
        lowercase: bool. Lower-case and strip accents first (BERT uncased).
        special_tokens: tokens placed first, in order (`[PAD]` must be first).
        batch_size: strings per batch fed to the learner.
    Returns:
        list of str: the vocabulary, special tokens first.
    """
    from tensorflow_text.tools.wordpiece_vocab import bert_vocab_from_dataset as bert_vocab

    if not isinstance(vocabulary_size, int) or vocabulary_size <= len(special_tokens):
        raise ValueError(
            f"`vocabulary_size` must be an integer above the {len(special_tokens)} special "
            f"tokens. Received: vocabulary_size={vocabulary_size!r}"
        )
    dataset = _as_dataset(data)
    if dataset.element_spec.shape.rank == 0:
        dataset = dataset.batch(batch_size)
    # Normalize as the tokenizer will; the learner then only splits words.
    dataset = dataset.map(lambda s: bert_normalize(s, lowercase))
    return bert_vocab.bert_vocab_from_dataset(
        dataset.prefetch(2),
        vocab_size=vocabulary_size,
        reserved_tokens=list(special_tokens),
        bert_tokenizer_params={"lower_case": False},
        learn_params={},
    )


@keras.saving.register_keras_serializable(package="keras_attn")
class WordPieceTokenizer(Tokenizer):
    """Strings to WordPiece ids (and back) with BERT's normalization, in the TensorFlow graph.

    Text is normalized as BERT does (`bert_normalize`: cleaning; NFD, accent stripping and
    lower-casing when `lowercase`), split on whitespace and punctuation, and each word is split
    greedily into the longest vocabulary pieces (`##` marks a word-internal piece) by
    tensorflow-text's linear-time `FastBertTokenizer`.

    Args:
        vocabulary: list of tokens, or the path of a `vocab.txt` (one token per line), e.g. a
            BERT vocabulary. `[PAD]` must be id 0 and `[UNK]` present. Can be set later with
            `set_vocabulary`.
        lowercase: bool. BERT uncased normalization. `False` keeps case and accents (cased).
        sequence_length: optional int. When set, outputs are dense `(batch, sequence_length)`,
            truncated and padded with 0; otherwise a `tf.RaggedTensor`.
        special_tokens: tokens dropped by `detokenize`; defaults to those of
            `SPECIAL_TOKENS` that the vocabulary holds, wherever they are.
        max_bytes_per_word: int. Longer words become `[UNK]`.
    Call arguments:
        inputs: string scalar or `(batch,)` string tensor.
    Returns:
        int32 ids: ragged `(batch, None)`, or dense `(batch, sequence_length)`.
    Example:
        >>> tok = WordPieceTokenizer(list(SPECIAL_TOKENS) + ["hello", "world", "!"])
        >>> tok.tokenize(["Hello world!"]).to_list()
        [[7, 8, 9]]
    """

    def __init__(
        self,
        vocabulary: Sequence[str] | str | None = None,
        lowercase: bool = True,
        sequence_length: int | None = None,
        special_tokens: Sequence[str] | None = None,
        max_bytes_per_word: int = 100,
        **kwargs: Any,
    ) -> None:
        # `None`: the tokens of SPECIAL_TOKENS that the vocabulary holds (known at set time).
        self._auto_special = special_tokens is None
        super().__init__(
            sequence_length=sequence_length,
            special_tokens=SPECIAL_TOKENS if special_tokens is None else special_tokens,
            **kwargs,
        )
        self.lowercase = lowercase
        self.max_bytes_per_word = max_bytes_per_word
        self._vocabulary: list[str] | None = None
        if vocabulary is not None:
            self.set_vocabulary(vocabulary)

    @classmethod
    def from_pretrained(cls, folder: str | os.PathLike[str], **kwargs: Any) -> Self:
        """The tokenizer of a Hugging Face folder: `vocab.txt` (or the WordPiece vocabulary in
        `tokenizer.json`), lower-casing from `tokenizer_config.json`'s `do_lower_case`.
        `kwargs` go to the constructor (`sequence_length`, …)."""
        from keras_attn.pretrained.folder import read_vocabulary

        vocabulary, lowercase = read_vocabulary(folder)
        return cls(vocabulary, **{"lowercase": lowercase, **kwargs})

    # Vocabulary --------------------------------------------------------------------------
    def set_vocabulary(self, vocabulary: Sequence[str] | str) -> None:
        """Sets the vocabulary from a list of tokens or a `vocab.txt` path."""
        if isinstance(vocabulary, str):
            if not os.path.exists(vocabulary):
                raise ValueError(
                    f"`vocabulary` path does not exist. Received: vocabulary={vocabulary!r}"
                )
            with open(vocabulary, encoding="utf-8") as f:
                vocabulary = [line.rstrip("\n") for line in f]
        vocabulary = [str(t) for t in vocabulary]
        if len(set(vocabulary)) != len(vocabulary):
            raise ValueError("`vocabulary` has duplicate tokens.")
        if not vocabulary or vocabulary[0] != "[PAD]" or "[UNK]" not in vocabulary:
            raise ValueError(
                "`vocabulary` must have '[PAD]' at id 0 and contain '[UNK]'. "
                f"Received: first tokens {vocabulary[:3]}"
            )
        if self._auto_special:
            present = set(vocabulary)
            self.special_tokens = tuple(t for t in SPECIAL_TOKENS if t in present)
        missing = [t for t in self.special_tokens if t not in set(vocabulary)]
        if missing:
            raise ValueError(f"special tokens {missing} are not in the `vocabulary`.")
        self._reset_compiled()
        self._vocabulary = vocabulary
        self._token_to_id = {t: i for i, t in enumerate(vocabulary)}
        options = {
            "vocab": vocabulary,
            "token_out_type": tf.int32,
            "unknown_token": "[UNK]",
            "max_bytes_per_word": self.max_bytes_per_word,
            "support_detokenization": True,
        }
        # bert_normalize normalizes as BERT does; the op's own normalization (NFKC case
        # folding) agrees with it only on plain ASCII, where it is the fast path.
        self._fast = tf_text.FastBertTokenizer(**options, lower_case_nfd_strip_accents=False)
        self._fast_ascii = tf_text.FastBertTokenizer(
            **options, lower_case_nfd_strip_accents=self.lowercase
        )

    def _check_vocabulary(self):
        if self._vocabulary is None:
            raise ValueError(
                "The tokenizer has no vocabulary. Pass `vocabulary=` or call `set_vocabulary`."
            )

    def get_vocabulary(self) -> list[str]:
        self._check_vocabulary()
        return list(self._vocabulary)  # type: ignore[arg-type]  # checked just above

    def vocabulary_size(self) -> int:
        self._check_vocabulary()
        return len(self._vocabulary)  # type: ignore[arg-type]  # checked just above

    def id_to_token(self, token_id: int) -> str:
        return self._vocabulary[self._check_id(token_id)]  # type: ignore[index]  # _check_id checks

    def token_to_id(self, token: str) -> int:
        self._check_vocabulary()
        if token not in self._token_to_id:
            raise ValueError(f"`token` is not in the vocabulary. Received: token={token!r}")
        return self._token_to_id[token]

    # Tokenization ------------------------------------------------------------------------
    def _tokenize(self, strings):
        self._check_vocabulary()
        # Rows of printable ASCII (and \t \n \r) need no cleaning, and there lower-casing is
        # all BERT's normalization does: the op's built-in path handles them. The other rows
        # are normalized explicitly; results are stitched back in the original order.
        plain = tf.strings.regex_full_match(strings, r"[\t\n\r\x20-\x7E]*")
        plain_rows = tf.reshape(tf.where(plain), [-1])
        other_rows = tf.reshape(tf.where(~plain), [-1])
        fast = self._fast_ascii.tokenize(tf.gather(strings, plain_rows))
        slow = self._fast.tokenize(bert_normalize(tf.gather(strings, other_rows), self.lowercase))
        order = tf.concat([plain_rows, other_rows], axis=0)
        merged = tf.concat([tf.cast(fast, tf.int32), tf.cast(slow, tf.int32)], axis=0)
        return tf.gather(merged, tf.math.invert_permutation(order))

    def _detokenize(self, ids):
        words = self._fast.detokenize(ids)
        if isinstance(words, tf.RaggedTensor) or words.shape.rank > 1:
            return tf.strings.reduce_join(words, axis=-1, separator=" ")
        return words

    # Saving ------------------------------------------------------------------------------
    def save_assets(self, dir_path: str) -> None:
        with open(os.path.join(dir_path, VOCABULARY_FILE), "w", encoding="utf-8") as f:
            f.write("\n".join(self.get_vocabulary()) + "\n")

    def load_assets(self, dir_path: str) -> None:
        self.set_vocabulary(os.path.join(dir_path, VOCABULARY_FILE))

    def get_config(self) -> dict[str, Any]:
        # The vocabulary travels as an asset file in `.keras` archives, not in the config.
        return {
            **super().get_config(),
            "vocabulary": None,
            "special_tokens": None if self._auto_special else list(self.special_tokens),
            "lowercase": self.lowercase,
            "max_bytes_per_word": self.max_bytes_per_word,
        }
