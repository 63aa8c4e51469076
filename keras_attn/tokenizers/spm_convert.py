"""A SentencePiece Unigram model file (T5's `spiece.model`) as the `tokenizer.json` that
`transformers`' `T5Tokenizer` builds from it, so that every path that reads a `tokenizer.json`
(the in-graph `UnigramTokenizer`, export, the server's `tokenizers`) reads it too.

The pieces and scores become a Unigram model, the charsmap a `Precompiled` normalizer, the
whitespace rules (strip, collapse, a `▁` before each word) `WhitespaceSplit` + `Metaspace`;
control and unknown pieces and T5's `<extra_id_N>` sentinels (appended in reverse, as
`transformers` numbers them) are special added tokens; `</s>` ends a single text.
"""

import base64
import os
from typing import Any

from keras_attn.tokenizers.pipeline import read_folder_json

MAX_MODEL_BYTES = 64 << 20  # T5's spiece.model is 0.8 MB, the largest hub ones ~10 MB
MAX_EXTRA_IDS = 10_000
UNIGRAM, NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE, UNUSED = 1, 1, 2, 3, 4, 6, 5


def read_sentencepiece_model(path: str | os.PathLike[str]) -> Any:
    """The `ModelProto` of a SentencePiece `.model` file, size-checked before it is read."""
    from sentencepiece import sentencepiece_model_pb2

    size = os.path.getsize(path)
    if size > MAX_MODEL_BYTES:
        raise ValueError(f"a SentencePiece model has {size} bytes; at most {MAX_MODEL_BYTES}")
    proto = sentencepiece_model_pb2.ModelProto()  # type: ignore[attr-defined]  # generated
    with open(path, "rb") as f:
        data = f.read()
    try:
        proto.ParseFromString(data)
    except Exception:  # protobuf's DecodeError, or a RuntimeError from the C++ parser
        raise ValueError(f"{os.path.basename(path)!r} is not a SentencePiece model file") from None
    if not proto.pieces:
        raise ValueError(f"{os.path.basename(path)!r} holds no SentencePiece pieces")
    return proto


def sentencepiece_tokenizer_json(proto: Any, extra_ids: int = 0) -> dict[str, Any]:
    """The `tokenizer.json` dict of a SentencePiece Unigram `ModelProto` in T5's layout.

    Args:
        proto: a `sentencepiece_model_pb2.ModelProto` (see `read_sentencepiece_model`).
        extra_ids: int. T5's sentinel count (`<extra_id_0>` gets the last id).
    Raises:
        ValueError: for a BPE or word/char model, `extra_ids` out of range, or a model with
            no `</s>` or `<unk>`.
    """
    if proto.trainer_spec.model_type != UNIGRAM:
        raise ValueError(
            "only SentencePiece Unigram models are read (T5's). Received: model_type "
            f"{proto.trainer_spec.model_type}"
        )
    if not isinstance(extra_ids, int) or not 0 <= extra_ids <= MAX_EXTRA_IDS:
        raise ValueError(
            f"`extra_ids` must be an integer in [0, {MAX_EXTRA_IDS}]. Received: {extra_ids!r}"
        )
    pieces = [(p.piece, float(p.score), p.type) for p in proto.pieces]
    pieces += [(f"<extra_id_{i}>", 0.0, CONTROL) for i in reversed(range(extra_ids))]
    names = {piece: i for i, (piece, _, _) in enumerate(pieces)}
    unk = proto.trainer_spec.unk_id
    if not 0 <= unk < len(proto.pieces) or "</s>" not in names:
        raise ValueError("a T5 SentencePiece model needs `<unk>` and `</s>` pieces")
    added = [
        {"id": i, "content": piece, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": kind != USER_DEFINED}
        for i, (piece, _, kind) in enumerate(pieces) if kind in (UNKNOWN, CONTROL, USER_DEFINED)
    ]  # fmt: skip
    charsmap = proto.normalizer_spec.precompiled_charsmap
    metaspace = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always",
                 "split": True}  # fmt: skip
    eos = {"id": "</s>", "type_id": 0}
    text_a, text_b = (
        {"Sequence": {"id": "A", "type_id": 0}},
        {"Sequence": {"id": "B", "type_id": 0}},
    )
    end = {"SpecialToken": eos}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {
            "type": "Precompiled",
            "precompiled_charsmap": base64.b64encode(charsmap).decode("ascii"),
        }
        if charsmap
        else None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [{"type": "WhitespaceSplit"}, metaspace],
        },
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [text_a, end],
            "pair": [text_a, end, text_b, end],
            "special_tokens": {"</s>": {"id": "</s>", "ids": [names["</s>"]], "tokens": ["</s>"]}},
        },
        "decoder": metaspace,
        "model": {
            "type": "Unigram",
            "unk_id": unk,
            "vocab": [[piece, score] for piece, score, _ in pieces],
            "byte_fallback": False,  # as T5Tokenizer builds it
        },
    }


def is_t5_folder(folder: str | os.PathLike[str]) -> bool:
    """Whether the folder says it is T5's (config.json's `model_type`, or
    tokenizer_config.json's `tokenizer_class`): the settings `spiece.model` is read with."""
    model_type = read_folder_json(folder, "config.json").get("model_type")
    tokenizer_class = read_folder_json(folder, "tokenizer_config.json").get("tokenizer_class")
    t5_classes = ("T5Tokenizer", "T5TokenizerFast")
    return model_type in ("t5", "mt5", "umt5") or tokenizer_class in t5_classes


def folder_extra_ids(folder: str | os.PathLike[str]) -> int:
    """T5's sentinel count for a folder: `tokenizer_config.json`'s `extra_ids`, else the
    `<extra_id_N>` among its special tokens, else 100 (`transformers`' default)."""
    config = read_folder_json(folder, "tokenizer_config.json")
    if "extra_ids" in config:
        return config["extra_ids"]
    tokens = config.get("additional_special_tokens") or config.get("extra_special_tokens") or []
    if not isinstance(tokens, list):
        raise ValueError("tokenizer_config.json's additional_special_tokens must be a list")
    count = sum(isinstance(t, str) and t.startswith("<extra_id_") for t in tokens)
    return count or 100
