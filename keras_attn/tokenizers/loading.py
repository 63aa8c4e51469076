"""`from_tokenizer_json`: the tokenizer class a Hugging Face `tokenizer.json` needs."""

import os
from collections.abc import Mapping
from typing import Any

from keras_attn.tokenizers.base import Tokenizer
from keras_attn.tokenizers.byte_pair import BytePairTokenizer
from keras_attn.tokenizers.pipeline import read_json_file
from keras_attn.tokenizers.spm_convert import (
    folder_extra_ids,
    is_t5_folder,
    read_sentencepiece_model,
    sentencepiece_tokenizer_json,
)
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


def folder_tokenizer_json(folder: str | os.PathLike[str]) -> dict[str, Any] | None:
    """A Hugging Face folder's `tokenizer.json` as a dict: the file itself, else the one
    `transformers` builds from T5's `spiece.model` (`spm_convert`); None with neither."""
    path = os.path.join(folder, "tokenizer.json")
    if os.path.exists(path):
        return read_json_file(path, "folder")
    model = os.path.join(folder, "spiece.model")
    if os.path.exists(model):
        if not is_t5_folder(folder):
            raise ValueError(
                "spiece.model is read with T5's settings only: the folder's config.json "
                "(model_type t5, mt5, umt5) or tokenizer_config.json (T5Tokenizer) must say T5"
            )
        proto = read_sentencepiece_model(model)
        return sentencepiece_tokenizer_json(proto, folder_extra_ids(folder))
    return None


def single_text_ids(spec: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """The ids a `tokenizer.json`'s post-processor puts before and after a single text: BART's
    and RoBERTa's `(<s>, </s>)`, Llama's `(<|begin_of_text|>, None)`, T5's `(None, </s>)`,
    GPT-2's and Qwen2's `(None, None)`; the start and end values of a packer."""
    post = spec.get("post_processor") or {}
    steps = post.get("processors", [post]) if post.get("type") == "Sequence" else [post]
    start = end = None
    for step in steps:
        if not isinstance(step, dict):
            continue
        if step.get("type") in ("RobertaProcessing", "BertProcessing"):
            cls, sep = step.get("cls") or [None, None], step.get("sep") or [None, None]
            start, end = _int_or_none(cls[1]), _int_or_none(sep[1])
        elif step.get("type") == "TemplateProcessing":
            single = [part for part in step.get("single") or [] if isinstance(part, dict)]
            special = step.get("special_tokens") or {}

            def id_of(part: dict[str, Any], special: dict[str, Any] = special) -> int | None:
                token = str((part.get("SpecialToken") or {}).get("id"))
                ids = (special.get(token) or {}).get("ids") or []
                return _int_or_none(ids[0]) if len(ids) == 1 else None

            if single and "SpecialToken" in single[0]:
                start = id_of(single[0])
            if len(single) > 1 and "SpecialToken" in single[-1]:
                end = id_of(single[-1])
    return start, end


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
