"""`from_tokenizer_json`: the tokenizer class a Hugging Face `tokenizer.json` needs."""

import os
from collections.abc import Mapping
from typing import Any

from keras_attn.tokenizers.base import Tokenizer
from keras_attn.tokenizers.byte_pair import BytePairTokenizer
from keras_attn.tokenizers.pipeline import read_json_file
from keras_attn.tokenizers.unigram import UnigramTokenizer
from keras_attn.tokenizers.wordpiece import WordPieceTokenizer


def from_tokenizer_json(
    source: str | os.PathLike[str] | Mapping[str, Any], **kwargs: Any
) -> Tokenizer:
    """A tokenizer from a Hugging Face `tokenizer.json` (a path, or the parsed dict).

    The model type picks the class: `WordPiece` → `WordPieceTokenizer` (BERT normalization,
    lower-casing as its `BertNormalizer` says), `BPE` → `BytePairTokenizer`, `Unigram` →
    `UnigramTokenizer`. A part we do not run the way `tokenizers` does raises a `ValueError`
    naming it. `kwargs` go to the constructor (`sequence_length`, …).

    Example:
        >>> tok = from_tokenizer_json("tokenizer.json", sequence_length=128)  # doctest: +SKIP
    """
    spec = dict(source) if isinstance(source, Mapping) else read_json_file(source, "source")
    model: dict[str, Any] = spec["model"] if isinstance(spec.get("model"), dict) else {}
    kind = model.get("type", "BPE" if "merges" in model else None)
    if kind == "WordPiece":
        vocab: dict[str, int] = model.get("vocab") or {}
        normalizer = spec.get("normalizer") or {}
        if normalizer.get("type") not in (None, "BertNormalizer"):
            raise ValueError(
                "a WordPiece tokenizer.json must use BertNormalizer (or none). Received: "
                f"normalizer type {normalizer.get('type')!r}"
            )
        lowercase = bool(normalizer.get("lowercase", False))
        tokens = sorted(vocab, key=vocab.__getitem__)
        return WordPieceTokenizer(tokens, **{"lowercase": lowercase, **kwargs})
    if kind == "BPE":
        return BytePairTokenizer.from_tokenizer_json(spec, **kwargs)
    if kind == "Unigram":
        return UnigramTokenizer.from_tokenizer_json(spec, **kwargs)
    raise ValueError(
        f"tokenizer.json's model must be WordPiece, BPE or Unigram. Received: model type {kind!r}"
    )
