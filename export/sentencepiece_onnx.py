"""SentencePiece tokenizers as onnxruntime-extensions' `SentencepieceTokenizer` operator, for
strings-in ONNX files: T5's Unigram `tokenizer.json` (the model rebuilt as a SentencePiece
`ModelProto` from its pieces, scores and `Precompiled` charsmap) and Marian's `source.spm`
(its piece ids mapped to `vocab.json`'s ids, `<unk>` where `vocab.json` lacks the piece).

The operator bundles its own SentencePiece build; the ids equal `transformers`' on ordinary
text (every corpus line of `tests/export/test_sentencepiece_onnx.py`) and differ on generated
mixed-script lines where it breaks ties between equally scored segmentations (runs of one
repeated character) its own way, where special tokens are written in the text (it tokenizes
them as text), for T5 where a line holds U+0085 or NUL (`transformers` splits at NEL), and
for Marian where the source model does not know a piece (`<unk>` here, where `transformers`
looks the piece's text up in `vocab.json`). Marian vocabularies with language codes
(`>>fr<<`, named first in a text) are refused.

Run the files in a process that has not loaded TensorFlow: with TensorFlow loaded first, the
operator's session crashes (`text_onnx.text_outputs`).
"""

import base64
from typing import TYPE_CHECKING, Any

from keras_attn.tokenizers import MarianTokenizer, UnigramTokenizer
from keras_attn.tokenizers.spm_convert import CONTROL, NORMAL, UNIGRAM, UNKNOWN, USER_DEFINED

if TYPE_CHECKING:
    import onnx

TOKENIZER_DOMAIN = "ai.onnx.contrib"


def sentencepiece_model(tokenizer: Any) -> tuple[bytes, list[int] | None]:
    """`(SentencePiece model bytes, id map)` of `tokenizer` for the operator: the map takes
    the model's piece ids to the tokenizer's (None: they are the same). A `ValueError` saying
    why for a tokenizer the operator cannot run."""
    if isinstance(tokenizer, MarianTokenizer):
        return _marian(tokenizer)
    if isinstance(tokenizer, UnigramTokenizer):
        return _unigram_proto(tokenizer.get_tokenizer_json()), None
    raise ValueError(f"{type(tokenizer).__name__} is not a SentencePiece tokenizer")


def _marian(tokenizer: MarianTokenizer) -> tuple[bytes, list[int]]:
    from sentencepiece import sentencepiece_model_pb2

    vocabulary = {token: i for i, token in enumerate(tokenizer.get_vocabulary())}
    codes = [t for t in vocabulary if t.startswith(">>") and t.endswith("<<")]
    if codes:
        raise ValueError(
            f"its vocabulary has language codes ({codes[0]!r}, …) that a text names first, "
            "and the operator does not split them out"
        )
    source = tokenizer.model_file(tokenizer.side)
    proto = sentencepiece_model_pb2.ModelProto()  # type: ignore[attr-defined]  # generated
    proto.ParseFromString(source)
    unk = vocabulary["<unk>"]
    return source, [vocabulary.get(piece.piece, unk) for piece in proto.pieces]


# `tokenizer.json` steps that SentencePiece's own normalization does: the charsmap, and
# (with `remove_extra_whitespaces`) stripping and collapsing spaces.
SPACE_STEPS = ({"type": "Strip"}, {"type": "Replace", "pattern": {"Regex": " {2,}"}})


def _space_step(step: dict[str, Any]) -> bool:
    return any(all(step.get(k) == v for k, v in kind.items()) for kind in SPACE_STEPS)


def _unigram_proto(spec: dict[str, Any]) -> bytes:
    """T5's `tokenizer.json` (a Unigram model, a `Precompiled` normalizer, `Metaspace`
    words) as the SentencePiece model it was converted from; a `ValueError` naming the first
    setting SentencePiece cannot reproduce."""
    from sentencepiece import sentencepiece_model_pb2

    model = spec["model"]
    normalizer = spec.get("normalizer") or {}
    steps = normalizer.get("normalizers", []) if normalizer.get("type") == "Sequence" else (
        [normalizer] if normalizer else [])  # fmt: skip
    charsmaps = [n for n in steps if n.get("type") == "Precompiled"]
    collapses = any(_space_step(n) for n in steps)
    others = [n.get("type") for n in steps if n.get("type") != "Precompiled" and not _space_step(n)]
    pre = spec.get("pre_tokenizer") or {}
    words = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    kinds = [w.get("type") for w in words]
    metaspace = words[-1] if kinds and kinds[-1] == "Metaspace" else {}
    scheme = metaspace.get("prepend_scheme") or (
        "always" if metaspace.get("add_prefix_space", True) else "never")  # fmt: skip
    unk, vocabulary = model.get("unk_id"), model.get("vocab", [])
    added = spec.get("added_tokens", [])
    # Tokens numbered past the model's pieces (`transformers` 5 adds T5's `<extra_id_N>` so)
    # become pieces of their own, in their order.
    beyond = sorted((t for t in added if t["id"] >= len(vocabulary)), key=lambda t: t["id"])
    why = None
    if model.get("type") != "Unigram" or model.get("byte_fallback"):
        why = "its model is not a Unigram without byte fallback"
    elif unk is None:
        why = "its Unigram model names no unknown piece"
    elif others:
        why = f"its normalizer has {others[0]!r}, beyond SentencePiece's charsmap and spaces"
    elif not metaspace or metaspace.get("replacement", "\u2581") != "\u2581" or set(
        kinds[:-1]) - {"WhitespaceSplit"}:  # fmt: skip
        why = f"its pre-tokenizer is {kinds}, not [WhitespaceSplit,] Metaspace('\u2581')"
    elif scheme == "first" and "WhitespaceSplit" in kinds:
        why = "its Metaspace prepends '\u2581' to the first word only"
    elif [t["id"] for t in beyond] != list(range(len(vocabulary), len(vocabulary) + len(beyond))):
        why = "its added tokens past the Unigram vocabulary do not follow it in order"
    if why is not None:
        raise ValueError(why)
    proto = sentencepiece_model_pb2.ModelProto()  # type: ignore[attr-defined]  # generated
    proto.trainer_spec.model_type = UNIGRAM
    proto.trainer_spec.unk_id = unk
    for name in ("bos_id", "eos_id", "pad_id"):
        setattr(proto.trainer_spec, name, -1)
    kind = {t["id"]: CONTROL if t.get("special") else USER_DEFINED for t in added}
    pieces = [*vocabulary, *([t["content"], 0.0] for t in beyond)]
    for i, (piece, score) in enumerate(pieces):
        proto.pieces.add(piece=piece, score=float(score),
                         type=UNKNOWN if i == unk else kind.get(i, NORMAL))  # fmt: skip
    normal = proto.normalizer_spec
    charsmap = charsmaps[0].get("precompiled_charsmap") if charsmaps else None
    normal.name = "nmt_nfkc" if charsmap else "identity"
    if charsmap:
        normal.precompiled_charsmap = base64.b64decode(charsmap)
    normal.add_dummy_prefix = scheme != "never"
    normal.remove_extra_whitespaces = collapses or "WhitespaceSplit" in kinds
    normal.escape_whitespaces = True
    return proto.SerializeToString()


def sentencepiece_graph(
    model: bytes, id_map: list[int] | None, opset: int = 17, ir_version: int = 8
) -> "onnx.ModelProto":
    """ONNX model: `text (1,)` string → `token_ids (1, n)` int32, the pieces' ids (mapped
    by `id_map` when given), no start or end id (`text_onnx.packed` adds them)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    def n(name: str) -> str:  # apart from tf2onnx's names in the merged graph
        return f"sentencepiece/{name}"

    constants: dict[str, np.ndarray] = {
        "nbest": np.array(0, np.int64), "alpha": np.array(0.0, np.float32),
        "no": np.array(False), "axis": np.array([0], np.int64),
    }  # fmt: skip
    if id_map is not None:
        constants["map"] = np.asarray(id_map, np.int32)
    nodes = [
        helper.make_node(
            "SentencepieceTokenizer",
            ["text", n("nbest"), n("alpha"), n("no"), n("no"), n("no")],
            [n("pieces"), n("rows")], domain=TOKENIZER_DOMAIN, model=model,
        ),
    ]  # fmt: skip
    ids = n("pieces")
    if id_map is not None:
        nodes.append(helper.make_node("Gather", [n("map"), ids], [n("mapped")]))
        ids = n("mapped")
    nodes.append(helper.make_node("Unsqueeze", [ids, n("axis")], ["token_ids"]))
    graph = helper.make_graph(
        nodes, "sentencepiece_tokenizer",
        [helper.make_tensor_value_info("text", TensorProto.STRING, [1])],
        [helper.make_tensor_value_info("token_ids", TensorProto.INT32, [1, None])],
        initializer=[numpy_helper.from_array(v, n(k)) for k, v in constants.items()],
    )  # fmt: skip
    return helper.make_model(
        graph,
        ir_version=ir_version,
        opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(TOKENIZER_DOMAIN, 1)],
    )
