"""WordPiece tokenization without TensorFlow: the `tokenizers` library with our exported vocabulary.

Configured to match `keras_attn.tokenizers.WordPieceTokenizer` (tensorflow-text's
`FastBertTokenizer`): BERT normalization (lower-casing and accent stripping when uncased),
whitespace and punctuation splitting, greedy longest-match WordPiece with `##` suffixes.
The ids agree on every line of the default corpus (tested).
"""

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers


class WordPieceTextTokenizer:
    """Text ↔ ids with an exported `tokenizer/` folder (`vocab.txt`, `tokenizer.json`)."""

    def __init__(
        self,
        vocabulary,
        lowercase=True,
        special_tokens=("[PAD]", "[UNK]"),
        unknown_token="[UNK]",
        max_bytes_per_word=100,
    ):
        self.vocabulary = list(vocabulary)
        self.special_tokens = tuple(special_tokens)
        self._special_ids = {i for i, t in enumerate(self.vocabulary) if t in set(special_tokens)}
        self.lowercase = lowercase
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
    def from_folder(cls, folder):
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

    @property
    def vocabulary_size(self):
        return len(self.vocabulary)

    def encode(self, texts):
        """A string or a list of strings to a list of ids (or a list of such lists)."""
        if isinstance(texts, str):
            return self.encode([texts])[0]
        encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=False)
        return [e.ids for e in encodings]

    def decode(self, ids):
        """Ids to text, special tokens dropped."""
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < len(self.vocabulary)]
        if bad:
            raise ValueError(f"`ids` must be in [0, {len(self.vocabulary)}). Received: {bad[:5]}")
        ids = [i for i in ids if i not in self._special_ids]
        return self._tokenizer.decode(ids, skip_special_tokens=False)
