"""Strings in, logits out, in one ONNX file: onnxruntime-extensions' `BertTokenizer` (WordPiece)
or `GPT2Tokenizer` (byte-level BPE with GPT-2's settings) operator, built from our exported
vocabulary, merged in front of the model graph with `onnx.compose`.

tf-text's tokenizer ops do not convert with tf2onnx, so the tokenizer is rebuilt from
onnxruntime-extensions operators instead. Running the file needs that package's custom-op
library (`SessionOptions.register_custom_ops_library(onnxruntime_extensions.get_library_path())`).

Known difference (onnxruntime-extensions 0.15): with lower-casing, its accent stripping does
not apply Unicode NFD decomposition to every character, so words with characters such as
`ř`, `ó` in `Łódź`, `İ`, or Hangul syllables map to `[UNK]` or other pieces where BERT's
reference tokenizer and ours decompose them first (`Dvořák` → `d ##vor ##ak` for us, `d ##vo
[UNK]` for the operator). ASCII and most Latin-1 text gives identical ids.

`GPT2Tokenizer` (0.15, given the added tokens) equals `tokenizers` on 9,730 of 9,730 generated
lines without NUL or U+0085, special tokens written in the text included, and differs on 146 of
the 270 lines with one: it stops at a NUL character and splits around U+0085 (NEL) its own way.
"""

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from keras_attn.tokenizers import BytePairTokenizer, WordPieceTokenizer

if TYPE_CHECKING:
    import numpy as np
    import onnx
    import onnxruntime as ort

TOKENIZER_DOMAIN = "ai.onnx.contrib"
# The only `tokenizer.json` settings `GPT2Tokenizer` reproduces: GPT-2's own.
GPT2_PRE_TOKENIZER = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}


def gpt2_compatible(tokenizer: BytePairTokenizer) -> str | None:
    """`None` when onnxruntime-extensions' `GPT2Tokenizer` can run `tokenizer`, else why not."""
    spec = tokenizer.get_tokenizer_json()
    pre = spec.get("pre_tokenizer") or {}
    if any(pre.get(key) != value for key, value in GPT2_PRE_TOKENIZER.items()):
        return f"its pre-tokenizer is not GPT-2's ByteLevel (received {pre!r})"[:200]
    if spec.get("normalizer") is not None:
        return f"it has a normalizer ({spec['normalizer'].get('type')!r})"
    model = spec["model"]
    for key in ("byte_fallback", "ignore_merges", "dropout", "continuing_subword_prefix",
                "end_of_word_suffix"):  # fmt: skip
        if model.get(key):
            return f"its model sets {key}={model[key]!r}"
    return None


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
    return _text_to_ids("wordpiece_tokenizer", nodes, opset, ir_version)


def bpe_tokenizer_graph(
    vocabulary: dict[str, int],
    merges: Iterable[tuple[str, str]],
    added_tokens: dict[str, int],
    max_length: int | None = None,
    opset: int = 17,
    ir_version: int = 8,
) -> "onnx.ModelProto":
    """ONNX model: `text (1,)` string → `token_ids (1, n)` int32, GPT-2-style byte-level BPE
    ids (`GPT2Tokenizer`), cut at `max_length` when given."""
    import json

    from onnx import TensorProto, helper

    def n(name: str) -> str:
        return f"bpe/{name}"

    nodes = [
        helper.make_node(
            "GPT2Tokenizer", ["text"], [n("ids"), n("mask")], domain=TOKENIZER_DOMAIN,
            vocab=json.dumps(vocabulary, ensure_ascii=False),
            merges="\n".join(f"{a} {b}" for a, b in merges), padding_length=-1,
            **({"added_token": "\n".join(f"{k}={v}" for k, v in added_tokens.items())}
               if added_tokens else {}),
        ),
        helper.make_node("Constant", [], [n("zero")], value_ints=[0]),
        helper.make_node("Constant", [], [n("one")], value_ints=[1]),
        helper.make_node("Constant", [], [n("limit")], value_ints=[max_length or 2**62]),
        helper.make_node("Slice", [n("ids"), n("zero"), n("limit"), n("one")], [n("cut")]),
        helper.make_node("Cast", [n("cut")], ["token_ids"], to=TensorProto.INT32),
    ]  # fmt: skip
    return _text_to_ids("bpe_tokenizer", nodes, opset, ir_version)


def _text_to_ids(
    name: str, nodes: list["onnx.NodeProto"], opset: int, ir_version: int
) -> "onnx.ModelProto":
    """The ONNX model of tokenizer `nodes`: `text (1,)` string in, `token_ids (1, n)` out."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("text", TensorProto.STRING, [1])],
        [helper.make_tensor_value_info("token_ids", TensorProto.INT32, [1, None])],
    )
    return helper.make_model(
        graph,
        ir_version=ir_version,
        opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(TOKENIZER_DOMAIN, 1)],
    )


def tokenizer_onnx(
    tokenizer: WordPieceTokenizer | BytePairTokenizer,
    max_length: int | None = None,
    opset: int = 17,
    ir_version: int = 8,
) -> "onnx.ModelProto":
    """`tokenizer` as an onnxruntime-extensions graph: `text (1,)` → `token_ids (1, n)`."""
    if isinstance(tokenizer, WordPieceTokenizer):
        vocabulary, lowercase = tokenizer.get_vocabulary(), tokenizer.lowercase
        return tokenizer_graph(vocabulary, lowercase, max_length, opset, ir_version)
    why = gpt2_compatible(tokenizer)
    if why is not None:
        raise ValueError(f"`GPT2Tokenizer` cannot run this BytePairTokenizer: {why}")
    spec = tokenizer.get_tokenizer_json()
    merges = [m.split(" ", 1) if isinstance(m, str) else m for m in spec["model"]["merges"]]
    return bpe_tokenizer_graph(
        spec["model"]["vocab"],
        [(a, b) for a, b in merges],
        {t["content"]: t["id"] for t in spec.get("added_tokens", [])},
        max_length,
        opset,
        ir_version,
    )


def packed(
    tokens: "onnx.ModelProto", start_id: int | None, end_id: int | None, max_length: int | None
) -> "onnx.ModelProto":
    """`tokens` (a tokenizer graph: `text` → `token_ids (1, n)`) with its ids packed as
    `StartEndPacker` packs them: cut to leave room for the start and end ids within
    `max_length`, then between `start_id` and `end_id` (each left out when None)."""
    import numpy as np
    from onnx import helper, numpy_helper

    def n(name: str) -> str:
        return f"packer/{name}"

    graph = tokens.graph
    for node in graph.node:  # the tokenizer's ids become the packer's input
        node.output[:] = [n("raw") if o == "token_ids" else o for o in node.output]
    room = (max_length or 2**62) - (start_id is not None) - (end_id is not None)
    if room < 0:
        raise ValueError(f"`max_length` {max_length} leaves no room for the start and end ids")
    constants = {"zero": np.array([0], np.int64), "room": np.array([room], np.int64)}
    parts = []
    for name, value in (("start", start_id), ("ids", None), ("end", end_id)):
        if name == "ids":
            parts.append(n("cut"))
        elif value is not None:
            constants[name] = np.array([value], np.int32)
            parts.append(n(name))
    graph.initializer.extend(numpy_helper.from_array(v, n(k)) for k, v in constants.items())
    graph.node.extend([
        helper.make_node("Squeeze", [n("raw"), n("zero")], [n("row")]),
        helper.make_node("Slice", [n("row"), n("zero"), n("room"), n("zero")], [n("cut")]),
        helper.make_node("Concat", parts, [n("packed")], axis=0),
        helper.make_node("Unsqueeze", [n("packed"), n("zero")], ["token_ids"]),
    ])  # fmt: skip
    return tokens


def write_text_onnx(
    model_path: Path,
    out_path: Path,
    tokenizer: WordPieceTokenizer | BytePairTokenizer,
    max_length: int | None = None,
    opset: int = 17,
) -> None:
    """Merges the tokenizer graph in front of the single-input model at `model_path`."""
    import onnx
    from onnx import compose

    model = onnx.load(model_path)
    (model_input,) = [i.name for i in model.graph.input]
    tokens = tokenizer_onnx(tokenizer, max_length, opset, model.ir_version)
    merged = compose.merge_models(tokens, model, io_map=[("token_ids", model_input)])
    onnx.save(merged, out_path)


# Run by `text_outputs` in a fresh interpreter: onnxruntime and the extensions' library only.
_RUN_TEXT_ONNX = """
import json, sys
import numpy as np
import onnxruntime as ort
from onnxruntime_extensions import get_library_path
options = ort.SessionOptions()
options.register_custom_ops_library(get_library_path())
session = ort.InferenceSession(sys.argv[1], options, providers=["CPUExecutionProvider"])
outputs = {}
for k, line in enumerate(json.load(sys.stdin)):
    for j, value in enumerate(session.run(None, {"text": np.array([line])})):
        outputs[f"{k}_{j}"] = value
np.savez(sys.argv[2], **outputs)
"""


def text_outputs(path: Path, lines: list[str]) -> list[list["np.ndarray"]]:
    """Each line's outputs (numeric arrays) of the strings-in file at `path`, computed in a
    fresh Python process without TensorFlow: the extensions' `SentencepieceTokenizer`
    segfaults where TensorFlow was loaded first (their protobuf builds clash; measured with
    onnxruntime-extensions 0.15 and TensorFlow 2.20), and export runs in such a process."""
    import json
    import subprocess
    import sys
    import tempfile

    import numpy as np

    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "outputs.npz"
        try:  # -I: the child imports nothing from the working directory or PYTHON* settings
            done = subprocess.run(
                [sys.executable, "-I", "-c", _RUN_TEXT_ONNX, str(path), str(out)],
                input=json.dumps(lines), capture_output=True, text=True, timeout=900,
                check=False,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"running {path.name} took over 900 s") from None
        if done.returncode != 0:
            why = done.stderr.strip()[-1500:] or "no message"
            raise RuntimeError(f"running {path.name} ended with code {done.returncode}: {why}")
        with np.load(out) as arrays:
            count = len(arrays.files) // max(len(lines), 1)
            return [[arrays[f"{k}_{j}"] for j in range(count)] for k in range(len(lines))]


def text_session(path: Path) -> "ort.InferenceSession":
    """An onnxruntime session for a strings-in file, with the extensions' ops registered."""
    import onnxruntime as ort
    from onnxruntime_extensions import get_library_path

    options = ort.SessionOptions()
    options.register_custom_ops_library(get_library_path())
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
