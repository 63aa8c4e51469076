"""`export_model`: one call from a trained Keras model to a verified artifact folder."""

import datetime
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import keras
from keras_attn_export import qkv_switch
from keras_attn_export.atomic import replace, temporary_folder
from keras_attn_export.compare import parity_rows, sweep, text_parity
from keras_attn_export.describe import (
    check_labels,
    check_max_length,
    embedding_spec,
    layer_attribute,
    max_sequence_length,
    model_input_ranges,
    packer_spec,
    task_of,
    versions,
    write_chat,
    write_tokenizer,
)
from keras_attn_export.functional import as_float32, check_task, split_text_model
from keras_attn_export.graphs import (
    export_decoding,
    export_text_onnx,
    is_causal_lm,
    write_int8,
    write_onnx_files,
)
from keras_attn_export.hardware import check_int8_weights
from keras_attn_export.manifest import write_manifest
from keras_attn_export.onnx import check_opset
from keras_attn_export.parity import (
    DEFAULT_BATCH_SIZES,
    DEFAULT_SEQUENCE_LENGTHS,
    ParityError,
    check,
    check_tolerance,
)
from keras_attn_export.report import print_report
from keras_attn_export.saved_model import (
    input_specs,
    load_signature,
    output_specs,
    write_saved_model,
)
from keras_attn_export.seq2seq import export_seq2seq, export_seq2seq_text_onnx, is_seq2seq
from keras_attn_export.weight_only import DEFAULT_BLOCK_SIZE, check_target, weight_only_request

from keras_attn.models.lora import lora_layers, merged_copy
from keras_attn.preprocessing import SegmentPacker, StartEndPacker, TextPreprocessor
from keras_attn.tokenizers import WordPieceTokenizer
from keras_attn.tokenizers.marian import MarianTokenizer
from keras_attn.tokenizers.pipeline import JsonTokenizer

if TYPE_CHECKING:
    from keras_attn_serving.manifest import Manifest


FORMATS = ("saved_model", "onnx", "generation")
DEFAULT_FORMATS = ("saved_model", "onnx")
KERAS_QUANTIZED_TOLERANCE = 5e-2
QUANTIZATIONS = (None, "int8")


def _check_formats(formats, optimize, quantize, strings_in):
    formats = tuple(formats)
    if not formats or any(f not in FORMATS for f in formats):
        raise ValueError(
            f"`formats` must be a non-empty subset of {DEFAULT_FORMATS}, or ['generation']. "
            f"Received: {formats}"
        )
    if "generation" in formats and (len(formats) > 1 or optimize or quantize or strings_in):
        raise ValueError(
            "formats=['generation'] writes a causal LM's decode_gqa.onnx alone (the 'onnx' "
            "format writes it too, beside model.onnx); it takes no `optimize`, `quantize` or "
            f"`strings_in`. Received: formats={formats}, optimize={optimize}, "
            f"quantize={quantize!r}, strings_in={strings_in}"
        )
    if quantize not in QUANTIZATIONS:
        raise ValueError(f"`quantize` must be one of {QUANTIZATIONS}. Received: {quantize!r}")
    if (optimize or quantize) and "onnx" not in formats:
        raise ValueError(
            "`optimize` and `quantize` work on the ONNX file: add 'onnx' to `formats`. "
            f"Received: formats={formats}"
        )
    return formats


TEXT_PARITY_TOLERANCE = 1e-5


def export_model(
    model: keras.Model,
    out_dir: str | Path,
    tokenizer: WordPieceTokenizer | JsonTokenizer | MarianTokenizer | None = None,
    packer: StartEndPacker | SegmentPacker | None = None,
    formats: Iterable[str] = DEFAULT_FORMATS,
    opset: int = 17,
    optimize: bool = False,
    quantize: str | None = None,
    int8_weights: str | None = None,
    weights: str | None = None,
    weights_block_size: int = DEFAULT_BLOCK_SIZE,
    weights_accuracy_level: int | None = None,
    max_length: int | None = None,
    tolerance: float | dict[str, float] | None = None,
    batch_sizes: Iterable[int] = DEFAULT_BATCH_SIZES,
    sequence_lengths: Iterable[int] = DEFAULT_SEQUENCE_LENGTHS,
    input_ranges: dict[str, tuple[int, int]] | None = None,
    strings_in: bool = False,
    labels: Sequence[str] | None = None,
    task: str | None = None,
    overwrite: bool = True,
    verbose: bool = True,
) -> "Manifest":
    """Exports `model` to `out_dir` as a SavedModel and ONNX, checked for parity.

    The folder holds `saved_model/`, `model.onnx`, `model.opt.onnx` (with `optimize`),
    `model.int8.onnx` (with `quantize="int8"`), `tokenizer/` (when a tokenizer is given) and
    `manifest.json` (inputs and outputs with named dynamic axes, opset, tool versions, sha256
    of every file, fused-operator counts per ONNX file, the parity table and the int8 drift).
    It is written to a temporary folder and renamed into place only when parity holds, so a
    failed export leaves nothing behind. Mixed-precision models export as float32; LoRA
    adapters are merged into their kernels, parity checked against the adapted model.

    Args:
        model: a functional Keras model (any `keras_attn.models` family or head, or the
            user's own). A task with a `preprocessor` is served with it (tokenizer files,
            `serve_text`, the manifest's `packer`), and so is a model whose string input goes
            through our `WordPieceTokenizer` (and packer): it is exported as its ids part
            (`keras_attn_export.functional.split_text_model`). Neither takes `tokenizer=`.
        out_dir: destination folder.
        tokenizer: optional `WordPieceTokenizer`, `BytePairTokenizer` or `UnigramTokenizer`,
            for a model with no preprocessor; its
            vocabulary is exported with the model, and the SavedModel gets a `serve_text`
            signature taking raw strings. A model with more than one input needs `packer`.
        packer: optional packer (e.g. `StartEndPacker`) between tokenizer and model in
            `serve_text`; without one, rows are padded with 0 to the longest.
        formats: subset of `("saved_model", "onnx")`, or `["generation"]` alone: a causal
            LM's `decode_gqa.onnx` (prompt and decode steps in one graph, weights beside it
            past 64 MiB) written from its weights with no SavedModel or tf2onnx, which is how
            models of hundreds of millions of parameters export; checked against Keras like
            the decode graphs of `"onnx"`, served for generation only.
        opset: ONNX opset, 13 to 18 (17 or more for `optimize`: LayerNormalization).
        optimize: also write `model.opt.onnx` with fused LayerNormalization and Gelu.
        quantize: `None` or `"int8"`: also write `model.int8.onnx` (dynamic quantization);
            its drift and argmax agreement are reported, never enforced.
        int8_weights: `None` (measure), `"s8"` or `"u8"`: the int8 weight type. Measured:
            both are written and run on the parity inputs, and the faster of those whose
            drift is within `keras_attn_export.hardware.DRIFT_BOUND` is kept (signed weights
            saturate on some CPUs, and which type is faster differs between CPUs). The
            manifest's `quantization` records both measurements, the choice and the CPU flags.
        weights: `None`/`"float32"`, `"int8"` or `"int4"`: a causal LM's decode graph with its
            projections and embedding weight-only quantized (`decode_gqa.int4.onnx`,
            onnxruntime's `MatMulNBits`; `keras_attn_export.weight_only`), served in place of
            the float32 one; the manifest's `decoding.gqa.weights` records the top-1 agreement
            and worst logit difference against the float model on held-out text.
        weights_block_size: weights per scale (a power of two, at least 16; default 32).
        weights_accuracy_level: 1 (float32 activations) or 4 (int8); `None` times both on the
            model's feed-forward shape and keeps the faster decode step.
        max_length: the longest sequence (prompt and new tokens) a causal LM's decode graphs
            hold, their key/value cache's length; at most, and by default, the model's own
            (its position table, or the length it was built with). Qwen2.5's 32,768
            positions are 805 MB of float32 cache a row: set it as llama.cpp's `n_ctx`.
        tolerance: float, or `{output name: float}`: the largest max-abs difference allowed
            between Keras and each float32 artifact. Defaults to `1e-4`; for a model
            quantized in Keras (`model.quantize("int8")`), whose artifacts run its int8 math,
            to `KERAS_QUANTIZED_TOLERANCE` (5e-2): each runtime quantizes activations on the
            fly, and one that lies on a rounding boundary can land one int8 step apart
            (measured up to 9.4e-3 on a seq2seq model; a wrong int8 graph is off by ~1).
        batch_sizes, sequence_lengths: the parity sweep; integer inputs get padded rows.
        input_ranges: optional `{input name: (low, high)}` for integer inputs of the sweep
            (defaults: token ids below the smallest vocabulary, segment ids 0 or 1).
        strings_in: also write `model.text.onnx`, raw text `(1,)` in, the model's outputs out
            (the tokenizer as onnxruntime-extensions operators; see `keras_attn_export.text_onnx`);
            for an encoder-decoder, `encode.text.onnx`: text in, the source ids and the
            cross-attention cache out (`keras_attn_export.seq2seq`). Needs
            onnxruntime-extensions, and a `tokenizer` with no `packer` for a model with one
            ids input, the model's preprocessor for an encoder-decoder.
        labels: optional class names of a model whose task is `classify` or `tag`, one per
            output class; the server's text endpoints answer with them.
        task: optional `"classify"`, `"tag"`, `"embed"` or `"generate"`: what the outputs
            are, for a model that is not one of our classes (checked against its outputs;
            see `keras_attn_export.functional`). Defaults to the class's task, or `None`.
        overwrite: replace an existing `out_dir`.
    Returns:
        the manifest (`keras_attn_serving.manifest.Manifest`; also readable by key).
    Raises:
        ParityError: with the table, when an artifact differs beyond `tolerance`.
    """
    if keras.backend.backend() != "tensorflow":
        raise ValueError(
            "export_model traces the model as a TensorFlow graph (SavedModel, tf2onnx): run it "
            "under the TensorFlow backend (KERAS_BACKEND=tensorflow; a model trained under "
            f"another backend loads there from its .keras file). Received backend: "
            f"{keras.backend.backend()!r}"
        )
    # Exported graphs are float32: a global mixed policy left set would make the layers
    # built while tracing compute in it (onnxruntime: "MatMul bound to different types").
    policy = keras.config.dtype_policy()
    keras.config.set_dtype_policy("float32")
    try:
        weight_only = weight_only_request(weights, weights_block_size, weights_accuracy_level)
        return _export(model, out_dir, tokenizer, packer, formats, opset, optimize, quantize,
                       int8_weights, weight_only, max_length, tolerance, batch_sizes,
                       sequence_lengths,
                       input_ranges, strings_in, labels, task, overwrite, verbose)  # fmt: skip
    finally:
        keras.config.set_dtype_policy(policy)


def _export(model, out_dir, tokenizer, packer, formats, opset, optimize, quantize, int8_weights,
            weight_only, max_length, tolerance, batch_sizes, sequence_lengths, input_ranges,
            strings_in, labels, task, overwrite, verbose) -> "Manifest":  # fmt: skip
    import onnx
    import onnxruntime as ort

    formats = _check_formats(formats, optimize, quantize, strings_in)
    check_int8_weights(int8_weights)
    if int8_weights is not None and not quantize:
        raise ValueError(f"`int8_weights` needs `quantize='int8'`. Received: {int8_weights!r}")
    check_opset(opset)
    if tolerance is not None:
        check_tolerance(tolerance)
    if optimize and opset < 17:
        raise ValueError(
            "`optimize` fuses LayerNormalization, an ONNX operator since opset 17. "
            f"Received: opset={opset}"
        )
    if not isinstance(model, keras.Model) or not hasattr(model, "inputs") or not model.inputs:
        raise ValueError(f"`model` must be a built functional keras.Model. Received: {model!r}")
    if tolerance is None:
        quantized = any(getattr(la, "quantization_mode", None) for la in model._flatten_layers())
        tolerance = KERAS_QUANTIZED_TOLERANCE if quantized else 1e-4
    task = check_task(model, task, task_of(model))
    preprocessor = getattr(model, "preprocessor", None)
    text_model = split_text_model(model)
    if preprocessor is not None or text_model is not None:
        if tokenizer is not None or packer is not None:
            raise ValueError(
                "`model` carries how it tokenizes ("
                + ("its `preprocessor`" if preprocessor is not None else "its string input")
                + "), and export serves exactly that: do not pass `tokenizer` or `packer`."
            )
    if text_model is not None:
        model, tokenizer, packer = text_model
    elif preprocessor is not None:
        tokenizer, packer = preprocessor.tokenizer, preprocessor.packer
    if tokenizer is not None and packer is None and len(model.inputs) > 1:
        advice = (
            "Give the task its preprocessor (`model.preprocessor = TextPreprocessor(tokenizer, "
            "SegmentPacker(...))`, as `from_pretrained` does) or pass `packer`."
            if hasattr(model, "preprocessor") else
            "Pass `packer` (e.g. `SegmentPacker(start_value=cls_id, end_value=sep_id, "
            "sequence_length=128)`); from the command line, export the Hugging Face folder "
            "itself (`keras-attn-export FOLDER OUT --task embed`)."
        )  # fmt: skip
        raise ValueError(
            f"`model` takes {[t.name for t in model.inputs]}: a `tokenizer` without the packer "
            f"the model was trained with would serve ids without its special tokens. {advice}"
        )
    if tokenizer is not None and not isinstance(
        tokenizer, WordPieceTokenizer | JsonTokenizer | MarianTokenizer
    ):
        raise ValueError(
            "`tokenizer` must be a WordPieceTokenizer, BytePairTokenizer, UnigramTokenizer or "
            "MarianTokenizer "
            "(those the server runs without TensorFlow). Received: "
            f"{type(tokenizer).__name__}"
        )
    check_labels(model, labels, task)
    generation = "generation" in formats
    if generation and not is_causal_lm(model, task):
        raise ValueError(
            "formats=['generation'] exports a causal LM's decode graph; this model's task "
            f"is {task!r}. Export it with formats=['saved_model', 'onnx']."
        )
    check_target(model, is_causal_lm(model, task), task, formats, weight_only)
    check_max_length(model, is_causal_lm(model, task), max_length)
    model = as_float32(model)
    # LoRA adapters are folded into their kernels for export; the parity sweep's reference
    # stays the adapted model itself.
    reference = model
    if lora_layers(model):
        model = merged_copy(model)
    if tokenizer is not None and preprocessor is None:
        preprocessor = TextPreprocessor(
            tokenizer, packer, None if packer is not None else max_sequence_length(model)
        )
    out_dir = Path(out_dir)
    if out_dir.exists() and not overwrite:
        raise ValueError(f"`out_dir` exists and overwrite=False. Received: out_dir={out_dir}")
    tmp = temporary_folder(out_dir)  # sweeps what a crashed export of out_dir left
    try:
        assets = write_tokenizer(tokenizer, tmp / "tokenizer") if tokenizer is not None else []
        signatures, saved = [], None
        if "saved_model" in formats:
            signatures = write_saved_model(model, tmp / "saved_model", assets, preprocessor)
            saved = load_signature(tmp / "saved_model")
        onnx_info, sessions, int8, quantization = {}, {}, None, None
        if "onnx" in formats:
            onnx_info = write_onnx_files(model, tmp, opset, optimize)
            sessions = {
                file: ort.InferenceSession(str(tmp / file), providers=["CPUExecutionProvider"])
                for file in onnx_info["files"]
            }
        cases, rows, worst = [], [], 0.0
        if not generation:  # the decode graph's own checks are its parity
            cases = sweep(reference, batch_sizes, sequence_lengths, input_ranges)
            branches = {file: list(qkv_switch.branch_sessions(onnx.load(tmp / file)).values())
                        for file in onnx_info.get("qkv_switch", {})}  # fmt: skip
            rows = parity_rows(cases, saved, sessions, onnx_info.get("unpadded"), branches)
            del branches
            worst = check(rows, tolerance)
        text_onnx = None
        if strings_in and not is_seq2seq(model):
            text_onnx = export_text_onnx(model, tmp, tokenizer, packer, sessions, opset)
        decoding = seq2seq = None
        if "onnx" in formats and is_causal_lm(model, task):
            decoding = export_decoding(model, tmp, opset, tolerance, weights=weight_only,
                                       tokenizer=tokenizer, max_length=max_length)  # fmt: skip
        if generation:
            decoding = export_decoding(model, tmp, opset, tolerance, tf2onnx_graph=False,
                                       weights=weight_only, tokenizer=tokenizer,
                                       max_length=max_length)  # fmt: skip
            worst = decoding["gqa"]["step_logits_max_abs_diff"]
        if "onnx" in formats and is_seq2seq(model):
            limit = tolerance.get("logits", 1e-4) if isinstance(tolerance, dict) else tolerance
            seq2seq = export_seq2seq(model, tmp, opset, limit)
        if strings_in and is_seq2seq(model):
            if seq2seq is None or tokenizer is None or packer is None:
                raise ValueError(
                    "`strings_in` for an encoder-decoder needs 'onnx' in `formats` and the "
                    "model's preprocessor (its tokenizer and packer)"
                )
            text_onnx = export_seq2seq_text_onnx(model, tmp, tokenizer, packer, opset)
        if quantize:
            quantization, int8 = write_int8(tmp, onnx_info, optimize, cases, int8_weights)
        strings_vs_ids = None
        if preprocessor is not None and saved is not None:
            strings_vs_ids = text_parity(tmp / "saved_model", preprocessor)
            # Same ids, same weights: equal, but for the last bits where the tokenizer's
            # graph (a BPE merge loop) changes how TensorFlow optimizes the function
            # (4.8e-7 measured); a wrong id moves outputs by orders of magnitude more.
            if strings_vs_ids > TEXT_PARITY_TOLERANCE:
                raise ParityError(
                    f"`serve_text` differs from `serving_default` on the same text by "
                    f"{strings_vs_ids:.3e} (> {TEXT_PARITY_TOLERANCE}): the strings graph does "
                    "not make the ids the preprocessor makes"
                )
        chat = write_chat(tmp, preprocessor)
        manifest = write_manifest(
            tmp,
            {
                "chat": chat,
                "created": datetime.datetime.now(datetime.UTC).isoformat(),
                "model_name": model.name,
                "inputs": input_specs(model),
                "outputs": output_specs(model),
                "task": task,
                "labels": labels,
                "packer": packer_spec(packer),
                "embedding": embedding_spec(model, task),
                "onnx": onnx_info or None,
                "saved_model": (
                    {"folder": "saved_model", "signatures": signatures} if saved else None
                ),
                "tokenizer": "tokenizer" if tokenizer is not None else None,
                "max_sequence_length": max_sequence_length(model),
                "vocabulary_size": layer_attribute(model, "vocabulary_size"),
                "input_ranges": model_input_ranges(model),
                "versions": versions(),
                "parity": {
                    "tolerance": tolerance,
                    "max_abs_diff": worst,
                    "rows": rows,
                    "serve_text_vs_serving_default": strings_vs_ids,
                },
                "int8": int8,
                "quantization": quantization,
                "decoding": decoding,
                "seq2seq": seq2seq,
                "text_onnx": text_onnx,
            },
        )
        replace(tmp, out_dir)  # old aside, new in, old deleted: one is always whole
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if verbose:
        print_report(rows, tolerance, worst, decoding, weight_only, quantization, int8)
    return manifest
