"""`keras-attn-export MODEL.keras OUT_DIR`: the command-line face of `export_model`."""

import argparse
import importlib
import json
import os
import re
import sys
import zipfile
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from keras_attn_export.parity import ParityError
from keras_attn_export.weight_only import DEFAULT_BLOCK_SIZE

import keras_attn  # noqa: F401  registers the layers and models for loading
from keras_attn.models import CausalLM, EncoderBackbone
from keras_attn.models.heads import folder_preprocessor
from keras_attn.pretrained.folder import read_config
from keras_attn.pretrained.registry import layout_for_config
from keras_attn.tokenizers import (
    BytePairTokenizer,
    Tokenizer,
    WordPieceTokenizer,
    from_tokenizer_json,
)
from keras_attn.tokenizers.loading import folder_tokenizer_json

if TYPE_CHECKING:
    import keras


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="keras-attn-export",
        description="Export a saved Keras model (.keras) to a verified artifact folder: "
        "SavedModel and/or ONNX, parity-checked against Keras, optionally optimized and "
        "quantized.",
    )
    parser.add_argument(
        "model",
        help="path to a .keras file, or a Hugging Face folder (config.json, model.safetensors "
        "and its tokenizer): an encoder is exported with its pooling and `[CLS] text [SEP]` "
        "packing (--task embed serves sentence embeddings)",
    )
    parser.add_argument(
        "--sequence-length", type=int, default=None,
        help="for a Hugging Face encoder folder: the length texts are packed to (default: the "
        "longest the encoder takes)",
    )  # fmt: skip
    parser.add_argument("out_dir", help="artifact folder to write (replaced if it exists)")
    parser.add_argument(
        "--formats",
        default=None,
        help="comma-separated: saved_model,onnx; or generation alone (a causal LM's decode "
        "graph, written from its weights: the default for a Hugging Face causal LM folder, "
        "whatever its size; saved_model,onnx otherwise)",
    )
    parser.add_argument("--opset", type=int, default=17, help="ONNX opset, 13 to 18")
    parser.add_argument(
        "--optimize", action="store_true", help="also write model.opt.onnx (fused operators)"
    )
    parser.add_argument(
        "--quantize", choices=["int8"], default=None, help="also write model.int8.onnx"
    )
    parser.add_argument(
        "--int8-weights",
        choices=["s8", "u8"],
        default=None,
        help="int8 weight type (default: measure both, keep the faster one within the drift bound)",
    )
    parser.add_argument(
        "--weights", choices=["float32", "int8", "int4"], default=None,
        help="a causal LM's decode graph with 8- or 4-bit weights (MatMulNBits), served in "
        "place of the float32 one",
    )  # fmt: skip
    parser.add_argument(
        "--weights-block-size",
        type=int,
        default=DEFAULT_BLOCK_SIZE,
        help=f"weights per scale (default {DEFAULT_BLOCK_SIZE})",
    )
    parser.add_argument(
        "--weights-accuracy-level", type=int, choices=[1, 4], default=None,
        help="1: float32 activations, 4: int8 (default: time both, keep the faster)",
    )  # fmt: skip
    parser.add_argument(
        "--max-length", type=int, default=None,
        help="a causal LM's decode graphs' cache length: the longest prompt plus new tokens "
        "(default: the model's positions)",
    )  # fmt: skip
    parser.add_argument(
        "--tolerance", type=float, default=None,
        help="largest Keras-vs-artifact max-abs difference (default 1e-4; 5e-2 for a model "
        "quantized in Keras)",
    )  # fmt: skip
    parser.add_argument(
        "--task",
        choices=["classify", "tag", "embed", "generate"],
        default=None,
        help="what the model's outputs are, for a model that is not a keras_attn class "
        "(the server's text endpoint follows it)",
    )
    parser.add_argument(
        "--labels",
        default=None,
        help="class names, comma-separated (or a JSON list), one per output class",
    )
    parser.add_argument(
        "--tokenizer",
        default=None,
        help="WordPiece vocabulary for the text endpoints: a vocab.txt, or a Hugging Face "
        "folder holding vocab.txt / tokenizer.json",
    )
    parser.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE before loading (it registers custom layers); repeatable. It is "
        "looked up in the current folder first; nothing else is imported from that folder",
    )
    return parser.parse_args(argv)


def parse_labels(text: str | None) -> list[str] | None:
    """`a,b,c` or a JSON list of strings -> list of str (None stays None)."""
    if text is None:
        return None
    if text.lstrip().startswith("["):
        try:
            labels = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"`--labels` is not a valid JSON list: {error}") from None
    else:
        labels = [label.strip() for label in text.split(",")]
    if not isinstance(labels, list) or not all(isinstance(x, str) and x for x in labels):
        raise ValueError(f"`--labels` must name non-empty labels. Received: --labels={text!r}")
    return labels


def load_tokenizer(path: str | None) -> "Tokenizer | None":
    """The tokenizer of `path` (None stays None): a Hugging Face folder (`tokenizer.json` of
    any model type we run, T5's `spiece.model`, `vocab.json` + `merges.txt`, or `vocab.txt`),
    a `tokenizer.json`
    file, or a WordPiece `vocab.txt` file."""
    if path is None:
        return None
    if os.path.isdir(path) and (spec := folder_tokenizer_json(path)) is not None:
        return from_tokenizer_json(spec)
    if path.endswith(".json") and os.path.isfile(path):
        return from_tokenizer_json(path)
    if os.path.isdir(path) and os.path.isfile(os.path.join(path, "merges.txt")):
        return BytePairTokenizer.from_pretrained(path)
    if os.path.isdir(path):
        return WordPieceTokenizer.from_pretrained(path)
    return WordPieceTokenizer(path)


def load_folder(path: str, sequence_length: int | None) -> tuple["keras.Model", Any, Any]:
    """`(model, tokenizer, packer)` of a Hugging Face folder: an encoder with the folder's
    pooling, tokenizer and `[CLS] text [SEP]` packer; a causal LM with its own preprocessor
    (tokenizer and packer None)."""
    kind = layout_for_config(read_config(path)).model_class
    if kind == "DecoderBackbone":
        return CausalLM.from_pretrained(path), None, None
    model = EncoderBackbone.from_pretrained(path)
    length = sequence_length or model.max_sequence_length - model.position_offset
    preprocessor = folder_preprocessor(path, length)
    if preprocessor is None:
        return model, None, None
    return model, preprocessor.tokenizer, preprocessor.packer


def load_model(path: str) -> "keras.Model":
    """`keras.saving.load_model`, its unknown-class error turned into a hint at `--import`."""
    import keras

    if not os.path.isfile(path):
        raise ValueError(f"no such model file: {path!r}")
    if path.endswith(".keras") and not zipfile.is_zipfile(path):
        raise ValueError(
            f"{path!r} is not a .keras archive (a zip file written by `model.save`); it may be "
            "truncated or another format"
        )
    try:
        return keras.saving.load_model(path)
    except TypeError as error:
        missing = re.search(r"Could not locate class '([^']+)'", str(error))
        if missing is None:
            raise
        name = missing.group(1)
        module = re.search(rf"'module': '([^']+)', 'class_name': '{re.escape(name)}'", str(error))
        where = f" (saved from module {module.group(1)!r})" if module else ""
        raise ValueError(
            f"the model uses class {name!r}{where}, which no imported module registers. Pass "
            "`--import MODULE` naming the module that defines and registers it."
        ) from None


def import_modules(names: Iterable[str]) -> None:
    """Imports each module named by `--import` (custom layers register themselves on import),
    looking in the current folder first, as `python -m` would. The folder is on the import
    path only while those modules load: nothing the user did not name (a stray `onnx.py`) is
    ever imported from it."""
    names = list(names)
    if not names:
        return
    folder = os.getcwd()
    added = folder not in sys.path
    if added:
        sys.path.insert(0, folder)
    try:
        for name in names:
            try:
                importlib.import_module(name)
            except ImportError as error:
                raise ValueError(f"`--import {name}` failed: {error}") from None
    finally:
        if added:
            sys.path.remove(folder)
        importlib.invalidate_caches()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    from keras_attn_export.api import export_model

    try:
        import_modules(args.imports)
        labels = parse_labels(args.labels)
        tokenizer, packer = load_tokenizer(args.tokenizer), None
        formats = args.formats or "saved_model,onnx"
        if os.path.isdir(args.model):
            if tokenizer is not None:
                raise ValueError("a Hugging Face folder brings its tokenizer: drop --tokenizer")
            model, tokenizer, packer = load_folder(args.model, args.sequence_length)
            fused = args.optimize or args.quantize  # options of the ONNX file alone
            if args.formats is None and isinstance(model, CausalLM) and not fused:
                formats = "generation"  # tf2onnx runs out of memory at these models' sizes
        else:
            model = load_model(args.model)
        manifest = export_model(
            model,
            args.out_dir,
            tokenizer=tokenizer,
            packer=packer,
            formats=[f.strip() for f in formats.split(",") if f.strip()],
            opset=args.opset,
            optimize=args.optimize,
            quantize=args.quantize,
            int8_weights=args.int8_weights,
            weights=args.weights,
            weights_block_size=args.weights_block_size,
            weights_accuracy_level=args.weights_accuracy_level,
            max_length=args.max_length,
            tolerance=args.tolerance,
            labels=labels,
            task=args.task,
        )
    except (ParityError, ValueError, OSError) as error:
        print(f"keras-attn-export: {error}", file=sys.stderr)
        return 1
    print(f"wrote {args.out_dir} ({len(manifest['files'])} files)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
