"""Strings in, logits out, in one ONNX file: onnxruntime-extensions' `BertTokenizer` operator
built from our exported vocabulary, merged in front of the model graph with `onnx.compose`.

tf-text's tokenizer ops do not convert with tf2onnx, so the tokenizer is rebuilt from
onnxruntime-extensions operators instead. Running the file needs that package's custom-op
library (`SessionOptions.register_custom_ops_library(onnxruntime_extensions.get_library_path())`).

Known difference (onnxruntime-extensions 0.15): with lower-casing, its accent stripping does
not apply Unicode NFD decomposition to every character, so words with characters such as
`ř`, `ó` in `Łódź`, `İ`, or Hangul syllables map to `[UNK]` or other pieces where BERT's
reference tokenizer and ours decompose them first (`Dvořák` → `d ##vor ##ak` for us, `d ##vo
[UNK]` for the operator). ASCII and most Latin-1 text gives identical ids.
"""

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx
    import onnxruntime as ort

    from keras_attn.tokenizers import WordPieceTokenizer

TOKENIZER_DOMAIN = "ai.onnx.contrib"


def tokenizer_graph(
    vocabulary: Iterable[str],
    lowercase: bool,
    max_length: int | None = None,
    opset: int = 17,
    ir_version: int = 8,
) -> "onnx.ModelProto":
    """ONNX model: `text (1,)` string → `token_ids (1, n)` int32, our WordPiece ids without
    the `[CLS]`/`[SEP]` the operator adds, cut at `max_length` when given."""
    from onnx import TensorProto, helper

    def n(name: str) -> str:  # the tokenizer's names, apart from tf2onnx's in the merged graph
        return f"wordpiece/{name}"

    nodes = [
        helper.make_node(
            "BertTokenizer", ["text"], [n("ids_cls_sep"), n("types"), n("mask")],
            domain=TOKENIZER_DOMAIN, vocab_file="\n".join(vocabulary),
            do_lower_case=int(lowercase), strip_accents=int(lowercase),
        ),
        helper.make_node("Constant", [], [n("one")], value_ints=[1]),
        helper.make_node("Constant", [], [n("minus_one")], value_ints=[-1]),
        helper.make_node("Constant", [], [n("zero")], value_ints=[0]),
        helper.make_node("Constant", [], [n("limit")], value_ints=[max_length or 2**62]),
        helper.make_node("Slice", [n("ids_cls_sep"), n("one"), n("minus_one"), n("zero")],
                         [n("ids")]),
        helper.make_node("Slice", [n("ids"), n("zero"), n("limit"), n("zero")], [n("cut")]),
        helper.make_node("Unsqueeze", [n("cut"), n("zero")], [n("row")]),
        helper.make_node("Cast", [n("row")], ["token_ids"], to=TensorProto.INT32),
    ]  # fmt: skip
    graph = helper.make_graph(
        nodes,
        "wordpiece_tokenizer",
        [helper.make_tensor_value_info("text", TensorProto.STRING, [1])],
        [helper.make_tensor_value_info("token_ids", TensorProto.INT32, [1, None])],
    )
    return helper.make_model(
        graph,
        ir_version=ir_version,
        opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(TOKENIZER_DOMAIN, 1)],
    )


def write_text_onnx(
    model_path: Path,
    out_path: Path,
    tokenizer: "WordPieceTokenizer",
    max_length: int | None = None,
    opset: int = 17,
) -> None:
    """Merges the tokenizer graph in front of the single-input model at `model_path`."""
    import onnx
    from onnx import compose

    model = onnx.load(model_path)
    (model_input,) = [i.name for i in model.graph.input]
    tokens = tokenizer_graph(
        tokenizer.get_vocabulary(), tokenizer.lowercase, max_length, opset, model.ir_version
    )
    merged = compose.merge_models(tokens, model, io_map=[("token_ids", model_input)])
    onnx.save(merged, out_path)


def text_session(path: Path) -> "ort.InferenceSession":
    """An onnxruntime session for a strings-in file, with the extensions' ops registered."""
    import onnxruntime as ort
    from onnxruntime_extensions import get_library_path

    options = ort.SessionOptions()
    options.register_custom_ops_library(get_library_path())
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
