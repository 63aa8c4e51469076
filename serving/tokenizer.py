"""Tokenization without TensorFlow: the `tokenizers` library with the exported `tokenizer/` folder.

`load_text_tokenizer` picks the reader: a Hugging Face `tokenizer.json` (a `model` in it: BPE,
Unigram, as `BytePairTokenizer` / `UnigramTokenizer` export it) runs as it is
(`JsonTextTokenizer`); our WordPiece folder (`vocab.txt` and its settings) runs in
`WordPieceTextTokenizer`; a Marian folder (`source.spm`, `vocab.json`) in `MarianTextTokenizer`
(`sentencepiece`).


Configured to match `keras_attn.tokenizers.WordPieceTokenizer` (tensorflow-text's
`FastBertTokenizer`): BERT normalization (lower-casing and accent stripping when uncased),
whitespace and punctuation splitting, greedy longest-match WordPiece with `##` suffixes.
Where the two runtimes' Unicode tables disagree (characters assigned or recategorized since
the older one), `wordpiece_unicode.json` says what the in-graph tokenizer does; a word of
more than `max_bytes_per_word` UTF-8 bytes is `[UNK]` in both. The ids agree on every line
of the default corpus and on 10,000 random-Unicode lines per case setting (tested).
"""

import functools
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Self, TypeVar, overload

from keras_attn_serving.token_bytes import TokenBytes
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

# Code points the two runtimes' Unicode tables treat differently, and what the in-graph
# tokenizer does with each (built by `python -m tests.tokenizers.unicode_table`).
UNICODE_TABLE_FILE = Path(__file__).with_name("wordpiece_unicode.json")
T = TypeVar("T")
WORD_STANDIN = "\ua000"  # a letter to both, in no BERT vocabulary: its word becomes [UNK]


@functools.cache
def _translation(lowercase):
    """`str.translate` table that makes the `tokenizers` pipeline see text as tensorflow-text
    does: characters it drops removed, characters it splits off spaced, letters it keeps in
    a word replaced by a stand-in letter."""
    with open(UNICODE_TABLE_FILE, encoding="utf-8") as f:
        table = json.load(f)["uncased" if lowercase else "cased"]
    translation = {c: None for c in table["drop"]}
    translation.update({c: f" {chr(c)} " for c in table["isolate"]})
    translation.update({c: WORD_STANDIN for c in table["word"]})
    return translation


class TokenizerError(ValueError):
    """The tokenizer failed on a text (e.g. a Rust panic in its regex engine)."""


def native(call: Callable[..., T], *args: Any) -> T:
    """`call(*args)` into the `tokenizers` library, with a Rust panic (pyo3's
    `PanicException`, a `BaseException` that escapes every `except Exception`) raised as a
    `TokenizerError` carrying its first line."""
    try:
        return call(*args)
    except Exception:
        raise
    except BaseException as error:
        if isinstance(error, KeyboardInterrupt | SystemExit | GeneratorExit):
            raise
        first = (str(error).splitlines() or [type(error).__name__])[0][:200]
        raise TokenizerError(f"the tokenizer failed on this text: {first}") from None


class TextTokenizer:
    """What the server asks of a tokenizer: `encode`, `decode` and the `vocabulary`."""

    vocabulary: list[str]

    @property
    def vocabulary_size(self) -> int:
        return len(self.vocabulary)

    def token(self, token_id: int) -> str:
        """The token of one id in `[0, vocabulary_size)`."""
        return self.vocabulary[token_id]

    @overload
    def encode(self, texts: str) -> list[int]: ...
    @overload
    def encode(self, texts: list[str]) -> list[list[int]]: ...
    def encode(self, texts: str | list[str]) -> list[int] | list[list[int]]:
        """A string or a list of strings to a list of ids (or a list of such lists)."""
        if isinstance(texts, str):
            return self.encode([texts])[0]
        return self._encode_all(texts)

    def _encode_all(self, texts: list[str]) -> list[list[int]]:
        raise NotImplementedError

    def token_bytes(self, token_id: int) -> bytes:
        """The UTF-8 bytes one id adds to a text (OpenAI's logprobs `bytes`), which may be
        part of a character: here, its text's; byte-level vocabularies know better."""
        return self.decode([token_id], skip_special=False).encode("utf-8")

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        raise NotImplementedError

    def _checked(self, ids: Iterable[int]) -> list[int]:
        ids = [int(i) for i in ids]
        size = self.vocabulary_size
        bad = [i for i in ids if not 0 <= i < size]
        if bad:
            raise ValueError(f"`ids` must be in [0, {size}). Received: {bad[:5]}")
        return ids


class WordPieceTextTokenizer(TextTokenizer):
    """Text ↔ ids with an exported `tokenizer/` folder (`vocab.txt`, `tokenizer.json`)."""

    def __init__(
        self,
        vocabulary: Iterable[str],
        lowercase: bool = True,
        special_tokens: Sequence[str] = ("[PAD]", "[UNK]"),
        unknown_token: str = "[UNK]",
        max_bytes_per_word: int = 100,
        unicode_table: Mapping[int, str | int | None] | None = None,
    ) -> None:
        self.vocabulary = list(vocabulary)
        # `unicode_table={}` switches the correction off (to build the table).
        self._translation = _translation(lowercase) if unicode_table is None else unicode_table
        self.special_tokens = tuple(special_tokens)
        self._special_ids = {i for i, t in enumerate(self.vocabulary) if t in set(special_tokens)}
        self.lowercase = lowercase
        self.max_bytes_per_word = max_bytes_per_word
        self._unknown_id = self.vocabulary.index(unknown_token)
        self._tokenizer = Tokenizer(
            models.WordPiece(
                {t: i for i, t in enumerate(self.vocabulary)},
                unk_token=unknown_token,
                max_input_chars_per_word=max_bytes_per_word,
            )
        )
        self._tokenizer.normalizer = normalizers.BertNormalizer(
            clean_text=True,
            handle_chinese_chars=True,
            strip_accents=lowercase,
            lowercase=lowercase,
        )
        self._tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        self._tokenizer.decoder = decoders.WordPiece(prefix="##")

    @classmethod
    def from_folder(cls, folder: str | Path) -> Self:
        folder = Path(folder)
        config = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
        vocabulary = (folder / "vocab.txt").read_text(encoding="utf-8").split("\n")
        if vocabulary and vocabulary[-1] == "":
            vocabulary = vocabulary[:-1]
        return cls(
            vocabulary,
            lowercase=config["lowercase"],
            special_tokens=config["special_tokens"],
            unknown_token=config["unknown_token"],
            max_bytes_per_word=config["max_bytes_per_word"],
        )

    def _encode_all(self, texts: list[str]) -> list[list[int]]:
        texts = [text if text.isascii() else text.translate(self._translation) for text in texts]
        if self.lowercase:
            # Full Unicode lower-casing, as BERT's reference and tf.strings.lower do: a final
            # capital sigma becomes ς (the `tokenizers` normalizer would write σ).
            texts = [text.lower() for text in texts]
        encodings = self._tokenizer.encode_batch(texts, add_special_tokens=False)
        return [
            e.ids if text.isascii() else self._limit_word_bytes(text, e.ids)
            for text, e in zip(texts, encodings, strict=True)
        ]

    def _limit_word_bytes(self, text, ids):
        """The in-graph tokenizer (tensorflow-text) turns a word of more than
        `max_bytes_per_word` UTF-8 *bytes* into `[UNK]`; the `tokenizers` model counts
        characters. Only non-ASCII words can differ: those are tokenized one by one here."""
        # Normalizing changes a word's bytes by less than 2x (lower-casing İ: 2 -> 3): when no
        # whitespace-separated chunk has half the limit, no word can pass it.
        if max(len(chunk.encode("utf-8")) for chunk in text.split() or [""]) * 2 <= (
            self.max_bytes_per_word
        ):
            return ids
        normalized = self._tokenizer.normalizer.normalize_str(text)
        words = self._tokenizer.pre_tokenizer.pre_tokenize_str(normalized)
        if all(len(word.encode("utf-8")) <= self.max_bytes_per_word for word, _ in words):
            return ids
        out = []
        for word, _ in words:
            if len(word.encode("utf-8")) > self.max_bytes_per_word:
                out.append(self._unknown_id)
            else:
                out.extend(token.id for token in self._tokenizer.model.tokenize(word))
        return out

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        """Ids to text, special tokens dropped (kept with `skip_special=False`)."""
        ids = [i for i in self._checked(ids) if not skip_special or i not in self._special_ids]
        return self._tokenizer.decode(ids, skip_special_tokens=False)

    @property
    def special_ids(self) -> frozenset[int]:
        return frozenset(self._special_ids)


class JsonTextTokenizer(TextTokenizer):
    """Text ↔ ids with an exported Hugging Face `tokenizer.json`, run by `tokenizers` itself.

    The in-graph tokenizers it was exported from (`BytePairTokenizer`, `UnigramTokenizer`) give
    the same ids (a 10,000-line differential per model type, tested); special tokens are
    never added (the manifest's packer adds what the model was trained with) and `decode`
    drops them, as the in-graph `detokenize` does.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        tokenizer.no_truncation()  # the in-graph tokenizer neither truncates nor pads
        tokenizer.no_padding()
        self._tokenizer = tokenizer
        self._size = tokenizer.get_vocab_size(with_added_tokens=True)

    @property
    def vocabulary_size(self) -> int:
        return self._size

    def token(self, token_id: int) -> str:
        return self._tokenizer.id_to_token(token_id) or ""

    @functools.cached_property
    def vocabulary(self) -> list[str]:  # type: ignore[override]  # built only when asked for
        return [self.token(i) for i in range(self._size)]

    @classmethod
    def from_folder(cls, folder: str | Path) -> Self:
        return cls(Tokenizer.from_file(str(Path(folder) / "tokenizer.json")))

    def _encode_all(self, texts: list[str]) -> list[list[int]]:
        # (is_pretokenized, add_special_tokens): the packer adds the special ids, not the
        # post-processor (a Llama BOS or a T5 `</s>` would come twice).
        encoded = native(self._tokenizer.encode_batch, texts, False, False)
        return [e.ids for e in encoded]

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        """Ids to text, special tokens dropped (kept with `skip_special=False`)."""
        return native(self._tokenizer.decode, self._checked(ids), skip_special)

    def token_bytes(self, token_id: int) -> bytes:
        """`TokenBytes`: what the vocabulary says, where its decoder would lose bytes."""
        own = self._token_bytes(token_id)
        return super().token_bytes(token_id) if own is None else own

    @functools.cached_property
    def _token_bytes(self) -> TokenBytes:
        return TokenBytes(self._tokenizer)

    @functools.cached_property
    def special_ids(self) -> frozenset[int]:
        """The ids of special added tokens (`<|im_end|>`): dropped from answers' text."""
        added = self._tokenizer.get_added_tokens_decoder()
        return frozenset(i for i, token in added.items() if token.special)


class MarianTextTokenizer(TextTokenizer):
    """Text ↔ ids with an exported Marian folder (`source.spm`, `vocab.json`), run by
    `sentencepiece` itself, as `transformers`' `MarianTokenizer` runs it: special tokens split
    out of the text, a leading `>>code<<` kept whole, pieces numbered by `vocab.json`."""

    def __init__(self, processor: Any, vocabulary: dict[str, int], special: Sequence[str]) -> None:
        self._spm = processor  # a loaded sentencepiece.SentencePieceProcessor
        self._ids = vocabulary
        self.vocabulary = sorted(vocabulary, key=vocabulary.__getitem__)
        self._unknown = vocabulary["<unk>"]
        self._special = {vocabulary[t] for t in special}
        self._split = re.compile(
            "(" + "|".join(map(re.escape, sorted(special, key=len)[::-1])) + ")"
        )

    @classmethod
    def from_folder(cls, folder: str | Path) -> Self:
        """Reads and checks the folder's files (each at most `MAX_TOKENIZER_BYTES`)."""
        import sentencepiece

        folder = Path(folder)
        config = _json_file(folder, "tokenizer.json")
        vocabulary = _json_file(folder, "vocab.json")
        special = config.get("special_tokens") if isinstance(config, dict) else None
        if not (isinstance(special, list) and special and "<unk>" in special
                and all(isinstance(t, str) and t for t in special)
                and len(set(special)) == len(special)):  # fmt: skip
            raise ValueError("the Marian tokenizer's settings must name its special tokens")
        ids = list(vocabulary.values()) if isinstance(vocabulary, dict) else []
        if not (ids and all(type(i) is int for i in ids) and sorted(ids) == list(range(len(ids)))
                and all(t in vocabulary for t in special)):  # fmt: skip
            raise ValueError(
                "the Marian tokenizer's vocab.json must number its tokens 0..n-1, its special "
                "tokens included"
            )
        source = _file_bytes(folder, "source.spm")
        processor = sentencepiece.SentencePieceProcessor()
        try:
            processor.LoadFromSerializedProto(source)
            pieces = processor.get_piece_size()
        except (RuntimeError, OSError, TypeError):
            pieces = 0
        if pieces <= 0:
            raise ValueError("the Marian tokenizer's source.spm is not a SentencePiece model")
        return cls(processor, vocabulary, special)

    def _encode_all(self, texts: list[str]) -> list[list[int]]:
        return [self._encode(text) for text in texts]

    def _encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for i, chunk in enumerate(self._split.split(text)):
            if i % 2:  # a special token
                ids.append(self._ids[chunk])
                continue
            if chunk.startswith(">>") and (end := chunk.find("<<")) != -1:
                ids.append(self._ids.get(chunk[: end + 2], self._unknown))
                chunk = chunk[end + 2 :]
            pieces = self._spm.encode(chunk, out_type=str)
            ids.extend(self._ids.get(piece, self._unknown) for piece in pieces)
        return ids

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        """Ids to text (special tokens dropped unless `skip_special=False`): the pieces joined,
        `▁` as a space, stripped, as `MarianTokenizer.decode` gives them."""
        kept = [i for i in self._checked(ids) if not skip_special or i not in self._special]
        return "".join(self.vocabulary[i] for i in kept).replace("\u2581", " ").strip()

    @property
    def special_ids(self) -> frozenset[int]:
        return frozenset(self._special)


# A tokenizer.json past these is refused before it is parsed or built: the largest real ones
# are ~35 MB (Gemma 3) and hold a few thousand added tokens at most.
MAX_TOKENIZER_BYTES = 64 << 20
MAX_ADDED_TOKENS = 65_536
SETTINGS_BYTES = 1 << 20  # our WordPiece settings file is a few hundred bytes


def _file_bytes(folder: Path, name: str) -> bytes:
    """A tokenizer file's bytes, size-checked first; errors name the file, not its path."""
    path = folder / name
    if not path.is_file():
        raise ValueError(f"the tokenizer folder has no {name}")
    size = path.stat().st_size
    if size > MAX_TOKENIZER_BYTES:
        raise ValueError(f"{name} has {size} bytes; at most {MAX_TOKENIZER_BYTES} are read")
    return path.read_bytes()


def _json_file(folder: Path, name: str) -> Any:
    data = _file_bytes(folder, name)
    try:
        return json.loads(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        raise ValueError(f"{name} is not valid JSON") from None


def load_text_tokenizer(
    folder: str | Path,
) -> "WordPieceTextTokenizer | JsonTextTokenizer | MarianTextTokenizer":
    """The reader an exported `tokenizer/` folder needs (see the module docstring).

    Raises:
        ValueError: naming `tokenizer.json` and what is wrong with it (too large, not JSON,
            a model or regex `tokenizers` refuses, too many added tokens).
    """
    path = Path(folder) / "tokenizer.json"
    size = path.stat().st_size
    if size > MAX_TOKENIZER_BYTES:
        raise ValueError(f"tokenizer.json has {size} bytes; at most {MAX_TOKENIZER_BYTES} are read")
    data = path.read_text(encoding="utf-8")
    if size <= SETTINGS_BYTES:
        try:
            config = json.loads(data)
        except ValueError as error:
            raise ValueError(f"tokenizer.json is not valid JSON: {error}") from None
        if isinstance(config, dict) and config.get("type") == "marian":
            return MarianTextTokenizer.from_folder(folder)
        if not (isinstance(config, dict) and isinstance(config.get("model"), dict)):
            return WordPieceTextTokenizer.from_folder(folder)
    try:  # parsed once, by `tokenizers` (its errors name the problem: JSON, model, regex)
        tokenizer = native(Tokenizer.from_str, data)
    except Exception as error:
        first = (str(error).splitlines() or [type(error).__name__])[0][:200]
        raise ValueError(f"tokenizer.json could not be read by `tokenizers`: {first}") from None
    added = tokenizer.get_vocab_size(True) - tokenizer.get_vocab_size(False)
    if added > MAX_ADDED_TOKENS:
        raise ValueError(f"tokenizer.json has {added} added tokens; at most {MAX_ADDED_TOKENS}")
    return JsonTextTokenizer(tokenizer)
