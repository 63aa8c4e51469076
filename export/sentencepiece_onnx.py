"""SentencePiece tokenizers as onnxruntime-extensions' `SentencepieceTokenizer` operator, for
strings-in ONNX files: T5's Unigram `tokenizer.json` (the model rebuilt as a SentencePiece
`ModelProto` from its pieces, scores and `Precompiled` charsmap) and Marian's `source.spm`
(its piece ids mapped to `vocab.json`'s ids, `<unk>` where `vocab.json` lacks the piece).

The operator bundles its own SentencePiece build; the ids equal `transformers`' on ordinary
text (every corpus line of `tests/export/test_sentencepiece_onnx.py`) and differ on generated
mixed-script lines where it breaks ties between equally scored segmentations (runs of one
repeated character) its own way, where special tokens are written in the text (it tokenizes
them as text), for T5 where a word holds a non-ASCII space (`transformers` splits there), and
for Marian where the source model does not know a piece (`<unk>` here, where `transformers`
looks the piece's text up in `vocab.json`). Marian vocabularies with language codes
(`>>fr<<`, named first in a text) are refused.

Run the files in a process that has not loaded TensorFlow: with TensorFlow loaded first, the
operator's session crashes (`text_onnx.text_outputs`).
"""

import base64
from typing import TYPE_CHECKING, Any

from keras_attn.tokenizers import MarianTokenizer, UnigramTokenizer
from keras_attn.tokenizers.spm_convert import CONTROL, NORMAL, UNIGRAM, UNKNOWN

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


def _unigram_proto(spec: dict[str, Any]) -> bytes:
    """T5's `tokenizer.json` (a Unigram model, a `Precompiled` normalizer, `Metaspace`
    words) as the SentencePiece model it was converted from."""
    from sentencepiece import sentencepiece_model_pb2

    model = spec["model"]
    normalizer = spec.get("normalizer") or {}
    if normalizer.get("type") == "Sequence":  # transformers' T5: Precompiled, then spaces
        kinds = [n for n in normalizer["normalizers"] if n.get("type") == "Precompiled"]
        normalizer = kinds[0] if kinds else {}
    pre = spec.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    metaspace = [s for s in steps if s.get("type") == "Metaspace"]
    why = None
    if model.get("type") != "Unigram" or model.get("byte_fallback"):
        why = "its model is not a Unigram without byte fallback"
    elif not metaspace or metaspace[0].get("replacement", "\u2581") != "\u2581":
        why = "its pre-tokenizer has no Metaspace '\u2581' words"
    elif normalizer and normalizer.get("type") != "Precompiled":
        why = f"its normalizer is {normalizer.get('type')!r}, not SentencePiece's charsmap"
    if why is not None:
        raise ValueError(why)
    proto = sentencepiece_model_pb2.ModelProto()  # type: ignore[attr-defined]  # generated
    proto.trainer_spec.model_type = UNIGRAM
    unk = model.get("unk_id")
    proto.trainer_spec.unk_id = -1 if unk is None else unk
    for name in ("bos_id", "eos_id", "pad_id"):
        setattr(proto.trainer_spec, name, -1)
    special = {t["id"] for t in spec.get("added_tokens", []) if t.get("special")}
    for i, (piece, score) in enumerate(model["vocab"]):
        kind = UNKNOWN if i == unk else CONTROL if i in special else NORMAL
        proto.pieces.add(piece=piece, score=float(score), type=kind)
    normal = proto.normalizer_spec
    normal.name = "nmt_nfkc" if normalizer else "identity"
    if normalizer:
        normal.precompiled_charsmap = base64.b64decode(normalizer["precompiled_charsmap"])
    normal.add_dummy_prefix = metaspace[0].get("prepend_scheme", "always") == "always"
    normal.remove_extra_whitespaces = normal.escape_whitespaces = True
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
