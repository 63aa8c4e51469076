"""`export_model`: one call from a trained Keras model to a verified artifact folder."""

import datetime
import json
import shutil
from pathlib import Path

import keras
import numpy as np
from keras_attn_export.atomic import replace, temporary_folder
from keras_attn_export.functional import check_task, split_text_model
from keras_attn_export.manifest import write_manifest
from keras_attn_export.onnx import check_opset, run_onnx, write_onnx
from keras_attn_export.parity import (
    DEFAULT_BATCH_SIZES,
    DEFAULT_SEQUENCE_LENGTHS,
    ParityError,
    check,
    check_tolerance,
    format_table,
    input_kind,
    max_abs_diff,
    sample_inputs,
)
from keras_attn_export.saved_model import (
    SIGNATURE,
    TEXT_SIGNATURE,
    call_model,
    input_specs,
    load_signature,
    output_specs,
    pack_text,
    write_saved_model,
)


def _versions() -> dict:
    import onnx
    import onnxruntime
    import tensorflow as tf
    import tf2onnx

    import keras_attn

    return {
        "keras_attn": keras_attn.__version__,
        "keras": keras.__version__,
        "tensorflow": tf.__version__,
        "tf2onnx": tf2onnx.__version__,
        "onnx": onnx.__version__,
        "onnxruntime": onnxruntime.__version__,
    }


def _layers(model):
    """The model's layers, nested models' layers included (a head's encoder)."""
    for layer in model.layers:
        yield layer
        if isinstance(layer, keras.Model):
            yield from _layers(layer)


def _smallest_layer_attribute(model, name):
    """Smallest integer `layer.<name>` over the model's layers (nested too), or None."""
    values = [getattr(layer, name, None) for layer in _layers(model)]
    values = [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
    return min(values) if values else None


def _max_token_id(model):
    """Ids to sample in the parity check: below the smallest vocabulary in the model."""
    return _smallest_layer_attribute(model, "vocabulary_size") or 2


def _input_ranges(model):
    """`{input name: [low, high)}` of the integer inputs whose values index a table (by the
    naming rule of `keras_attn_export.parity.input_kind`): token ids (the vocabulary), segment ids
    (`num_segments`), padding masks (0 or 1). The server refuses values outside them."""
    ranges = {}
    bounds = {
        "token": _smallest_layer_attribute(model, "vocabulary_size"),
        "segment": _smallest_layer_attribute(model, "num_segments"),
        "mask": 2,
    }
    for spec in input_specs(model):
        kind = input_kind(spec["name"])
        if np.issubdtype(np.dtype(spec["dtype"]), np.integer) and bounds.get(kind):
            ranges[spec["name"]] = [0, bounds[kind]]
    return ranges


def _max_sequence_length(model):
    """The longest input a learned position table allows (less an encoder's position offset,
    RoBERTa's 2), or None."""
    table = _smallest_layer_attribute(model, "sequence_length")
    if table is None:
        return None
    return table - (_smallest_layer_attribute(model, "position_offset") or 0)


# Model class -> the text endpoint that serves it (`keras_attn_serving.text`).
TASKS = {
    "CausalLM": "generate",
    "SequenceClassifier": "classify",
    "TokenClassifier": "tag",
    "Encoder": "embed",
    "SpanQA": "span_qa",
    "MultipleChoice": "multiple_choice",
    "EncoderPretrainer": "pretraining",
    "Seq2Seq": "seq2seq",
}


def task_of(model):
    """The manifest's `task`: what the model does, from its class (`None` for other models)."""
    import keras_attn.models as models

    for name, task in TASKS.items():
        if isinstance(model, getattr(models, name)):
            return task
    return None


def check_labels(model, labels, task):
    if labels is None:
        return
    if task not in ("classify", "tag"):
        raise ValueError(
            "`labels` names the classes of a model whose task is 'classify' or 'tag' (a "
            "SequenceClassifier, a TokenClassifier, or any model exported with that `task`). "
            f"Received labels for a {type(model).__name__} with task={task!r}"
        )
    classes = model.outputs[0].shape[-1]
    if not all(isinstance(x, str) for x in labels) or len(labels) != classes:
        raise ValueError(
            f"`labels` must be {classes} strings, one per class. Received: labels={labels!r}"
        )


def packer_spec(packer):
    """The manifest's `packer`: what the server adds around one text's ids, or `None`."""
    from keras_attn.preprocessing import SegmentPacker, StartEndPacker

    if packer is None:
        return None
    if not isinstance(packer, (StartEndPacker, SegmentPacker)):
        raise ValueError(
            "`packer` must be a StartEndPacker or a SegmentPacker. "
            f"Received: {type(packer).__name__}"
        )
    return {
        "type": "segment" if isinstance(packer, SegmentPacker) else "start_end",
        "sequence_length": packer.sequence_length,
        "start_value": packer.start_value,
        "end_value": packer.end_value,
        "pad_value": packer.pad_value,
    }


def _write_tokenizer(tokenizer, folder: Path) -> list[Path]:
    folder.mkdir()
    vocab = folder / "vocab.txt"
    vocab.write_text("\n".join(tokenizer.get_vocabulary()) + "\n", encoding="utf-8")
    config = {
        "type": "wordpiece",
        "lowercase": tokenizer.lowercase,
        "strip_accents": tokenizer.lowercase,
        "special_tokens": list(tokenizer.special_tokens),
        "unknown_token": "[UNK]",
        "suffix_indicator": "##",
        "max_bytes_per_word": tokenizer.max_bytes_per_word,
        "pad_id": 0,
    }
    (folder / "tokenizer.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    return [vocab]


TEXT_SAMPLES = [
    "To be, or not to be: that is the question.",
    "Café naïve résumé 日本語 🙂 it´s",
    "a",
]


def text_parity(folder: Path, tokenizer, packer=None, max_length=None) -> float:
    """Max |serve_text(strings) - serving_default(ids of those strings)|; 0 when they agree."""
    import tensorflow as tf

    serve_text = load_signature(folder, TEXT_SIGNATURE)
    serve_ids = load_signature(folder, SIGNATURE)
    text = tf.constant(TEXT_SAMPLES)
    ids = pack_text(tokenizer, packer, max_length, text)
    from_text = serve_text(text=text)
    (name,) = [spec.name for spec in serve_ids.structured_input_signature[1].values()]
    from_ids = serve_ids(**{name: ids})
    return max(max_abs_diff(from_text[k].numpy(), from_ids[k].numpy()) for k in from_ids)


def sweep(model, batch_sizes, sequence_lengths, input_ranges=None):
    """The parity sweep's cases, Keras run once each: `[(batch, seq, feeds, {output: array})]`."""
    specs = input_specs(model)
    cases = []
    for batch in batch_sizes:
        for seq in sequence_lengths:
            feeds = sample_inputs(specs, batch, seq, _max_token_id(model), input_ranges)
            reference = {
                k: keras.ops.convert_to_numpy(v) for k, v in call_model(model, feeds).items()
            }
            cases.append((batch, seq, feeds, reference))
    return cases


def parity_rows(cases, saved, sessions):
    """Max-abs differences vs Keras for each output and case of `sweep`, one column per
    artifact (`saved` may be None; `sessions` maps an ONNX file to its session)."""
    import tensorflow as tf

    rows = []
    for batch, seq, feeds, reference in cases:
        runs = {}
        if saved is not None:
            out = saved(**{k: tf.constant(v) for k, v in feeds.items()})
            runs["saved_model"] = {k: v.numpy() for k, v in out.items()}
        for file, session in sessions.items():
            runs[COLUMNS[file]] = run_onnx(session, feeds)
        for name, ref in reference.items():
            row = {"output": name, "batch": batch, "seq": seq}
            for artifact, out in runs.items():
                row[f"{artifact}_vs_keras"] = max_abs_diff(out[name], ref)
            rows.append(row)
    return rows


def quantization_drift(cases, session):
    """How far int8 outputs move from Keras over the `sweep` cases: per output, the largest
    absolute difference, that difference relative to the largest |Keras output|, and the
    fraction of positions whose argmax over the last axis is unchanged."""
    report = {}
    for _, _, feeds, reference in cases:
        quantized = run_onnx(session, feeds)
        for name, ref in reference.items():
            ref, got = ref.astype("float64"), quantized[name].astype("float64")
            entry = report.setdefault(name, {"max_abs_diff": 0.0, "scale": 0.0, "same": []})
            entry["max_abs_diff"] = max(entry["max_abs_diff"], max_abs_diff(got, ref))
            entry["scale"] = max(entry["scale"], float(np.abs(ref).max()))
            entry["same"].append((got.argmax(-1) == ref.argmax(-1)).ravel())
    return {
        name: {
            "max_abs_diff": e["max_abs_diff"],
            "relative_drift": e["max_abs_diff"] / max(e["scale"], 1e-12),
            "argmax_agreement": float(np.concatenate(e["same"]).mean()),
        }
        for name, e in report.items()
    }


def as_float32(model: keras.Model) -> keras.Model:
    """`model` itself when it computes in float32, else a float32 copy with its weights:
    exported graphs are float32 whatever policy the model trained under."""
    layers = list(model._flatten_layers(include_self=True))
    if all(layer.dtype_policy.name == "float32" for layer in layers):
        return model

    def float32_policies(value):
        if isinstance(value, dict):
            if value.get("class_name") in ("DTypePolicy", "DTypePolicyMap"):
                return "float32"
            return {k: float32_policies(v) for k, v in value.items()}
        if isinstance(value, list):
            return [float32_policies(v) for v in value]
        if isinstance(value, str) and value.startswith("mixed_"):
            return "float32"
        return value

    config = float32_policies(keras.saving.serialize_keras_object(model))
    copy = keras.saving.deserialize_keras_object(config)
    copy.set_weights([np.asarray(w, dtype="float32") for w in model.get_weights()])
    return copy


FORMATS = ("saved_model", "onnx")
COLUMNS = {"model.onnx": "onnx", "model.opt.onnx": "onnx_opt"}  # parity table columns
QUANTIZATIONS = (None, "int8")


def _check_formats(formats, optimize, quantize):
    formats = tuple(formats)
    if not formats or any(f not in FORMATS for f in formats):
        raise ValueError(f"`formats` must be a non-empty subset of {FORMATS}. Received: {formats}")
    if quantize not in QUANTIZATIONS:
        raise ValueError(f"`quantize` must be one of {QUANTIZATIONS}. Received: {quantize!r}")
    if (optimize or quantize) and "onnx" not in formats:
        raise ValueError(
            "`optimize` and `quantize` work on the ONNX file: add 'onnx' to `formats`. "
            f"Received: formats={formats}"
        )
    return formats


def export_model(
    model: keras.Model,
    out_dir,
    tokenizer=None,
    packer=None,
    formats=FORMATS,
    opset: int = 17,
    optimize: bool = False,
    quantize=None,
    tolerance=1e-4,
    batch_sizes=DEFAULT_BATCH_SIZES,
    sequence_lengths=DEFAULT_SEQUENCE_LENGTHS,
    input_ranges=None,
    strings_in: bool = False,
    labels=None,
    task=None,
    overwrite: bool = True,
    verbose: bool = True,
) -> dict:
    """Exports `model` to `out_dir` as a SavedModel and ONNX, checked for parity.

    The folder holds `saved_model/`, `model.onnx`, `model.opt.onnx` (with `optimize`),
    `model.int8.onnx` (with `quantize="int8"`), `tokenizer/` (when a tokenizer is given) and
    `manifest.json` (inputs and outputs with named dynamic axes, opset, tool versions, sha256
    of every file, fused-operator counts per ONNX file, the parity table and the int8 drift).
    It is written to a temporary folder and renamed into place only when parity holds, so a
    failed export leaves nothing behind. Mixed-precision models export as float32.

    Args:
        model: a functional Keras model (any `keras_attn.models` family or head, or the
            user's own). A model whose string input goes through our `WordPieceTokenizer`
            (and packer) is exported as its ids part with that tokenizer and packer
            (`keras_attn_export.functional.split_text_model`).
        out_dir: destination folder.
        tokenizer: optional `WordPieceTokenizer`; its vocabulary is exported with the model,
            and the SavedModel gets a `serve_text` signature taking raw strings.
        packer: optional packer (e.g. `StartEndPacker`) between tokenizer and model in
            `serve_text`; without one, rows are padded with 0 to the longest.
        formats: subset of `("saved_model", "onnx")`.
        opset: ONNX opset, 13 to 18 (17 or more for `optimize`: LayerNormalization).
        optimize: also write `model.opt.onnx` with fused LayerNormalization and Gelu.
        quantize: `None` or `"int8"`: also write `model.int8.onnx` (dynamic quantization,
            uint8 weights); its drift and argmax agreement are reported, never enforced.
        tolerance: float, or `{output name: float}`: the largest max-abs difference allowed
            between Keras and each float32 artifact.
        batch_sizes, sequence_lengths: the parity sweep; integer inputs get padded rows.
        input_ranges: optional `{input name: (low, high)}` for integer inputs of the sweep
            (defaults: token ids below the smallest vocabulary, segment ids 0 or 1).
        strings_in: also write `model.text.onnx`, raw text `(1,)` in, the model's outputs out
            (the tokenizer as onnxruntime-extensions operators; see `keras_attn_export.text_onnx`).
            Needs `tokenizer`, one ids input, no `packer`, and onnxruntime-extensions.
        labels: optional class names of a model whose task is `classify` or `tag`, one per
            output class; the server's text endpoints answer with them.
        task: optional `"classify"`, `"tag"`, `"embed"` or `"generate"`: what the outputs
            are, for a model that is not one of our classes (checked against its outputs;
            see `keras_attn_export.functional`). Defaults to the class's task, or `None`.
        overwrite: replace an existing `out_dir`.
    Returns:
        the manifest, as a dict.
    Raises:
        ParityError: with the table, when an artifact differs beyond `tolerance`.
    """
    import onnxruntime as ort

    from keras_attn.tokenizers import WordPieceTokenizer

    formats = _check_formats(formats, optimize, quantize)
    check_opset(opset)
    check_tolerance(tolerance)
    if optimize and opset < 17:
        raise ValueError(
            "`optimize` fuses LayerNormalization, an ONNX operator since opset 17. "
            f"Received: opset={opset}"
        )
    if tokenizer is not None and not isinstance(tokenizer, WordPieceTokenizer):
        raise ValueError(
            "`tokenizer` must be a WordPieceTokenizer: the server-side tokenizer files "
            f"exist for WordPiece only so far. Received: {type(tokenizer).__name__}"
        )
    if not isinstance(model, keras.Model) or not hasattr(model, "inputs") or not model.inputs:
        raise ValueError(f"`model` must be a built functional keras.Model. Received: {model!r}")
    task = check_task(model, task, task_of(model))
    text_model = split_text_model(model)
    if text_model is not None:
        if tokenizer is not None or packer is not None:
            raise ValueError(
                "`model` tokenizes its string input itself; do not pass `tokenizer` or `packer`."
            )
        model, tokenizer, packer = text_model
    check_labels(model, labels, task)
    model = as_float32(model)
    out_dir = Path(out_dir)
    if out_dir.exists() and not overwrite:
        raise ValueError(f"`out_dir` exists and overwrite=False. Received: out_dir={out_dir}")
    tmp = temporary_folder(out_dir)  # sweeps what a crashed export of out_dir left
    try:
        assets = _write_tokenizer(tokenizer, tmp / "tokenizer") if tokenizer is not None else []
        max_length = _max_sequence_length(model)
        signatures, saved = [], None
        if "saved_model" in formats:
            signatures = write_saved_model(
                model, tmp / "saved_model", assets, tokenizer, packer, max_length
            )
            saved = load_signature(tmp / "saved_model")
        onnx_info, sessions, int8 = {}, {}, None
        if "onnx" in formats:
            onnx_info = _write_onnx_files(model, tmp, opset, optimize, quantize)
            sessions = {
                file: ort.InferenceSession(str(tmp / file), providers=["CPUExecutionProvider"])
                for file in onnx_info["files"]
                if file != "model.int8.onnx"
            }
        cases = sweep(model, batch_sizes, sequence_lengths, input_ranges)
        rows = parity_rows(cases, saved, sessions)
        worst = check(rows, tolerance)
        text_onnx = None
        if strings_in:
            text_onnx = _export_text_onnx(model, tmp, tokenizer, packer, sessions, opset)
        decoding = None
        if "onnx" in formats and _is_causal_lm(model, task):
            decoding = _export_decoding(model, tmp, opset, tolerance)
        if quantize:
            session = ort.InferenceSession(
                str(tmp / "model.int8.onnx"), providers=["CPUExecutionProvider"]
            )
            int8 = quantization_drift(cases, session)
        strings_vs_ids = None
        if tokenizer is not None and saved is not None:
            strings_vs_ids = text_parity(tmp / "saved_model", tokenizer, packer, max_length)
            if strings_vs_ids != 0.0:
                raise ParityError(
                    f"`serve_text` differs from `serving_default` on the same text by "
                    f"{strings_vs_ids:.3e}; they must agree exactly"
                )
        manifest = write_manifest(
            tmp,
            {
                "created": datetime.datetime.now(datetime.UTC).isoformat(),
                "model_name": model.name,
                "inputs": input_specs(model),
                "outputs": output_specs(model),
                "task": task,
                "labels": labels,
                "packer": packer_spec(packer),
                "onnx": onnx_info or None,
                "saved_model": (
                    {"folder": "saved_model", "signatures": signatures} if saved else None
                ),
                "tokenizer": "tokenizer" if tokenizer is not None else None,
                "max_sequence_length": _max_sequence_length(model),
                "vocabulary_size": _smallest_layer_attribute(model, "vocabulary_size"),
                "input_ranges": _input_ranges(model),
                "versions": _versions(),
                "parity": {
                    "tolerance": tolerance,
                    "max_abs_diff": worst,
                    "rows": rows,
                    "serve_text_vs_serving_default": strings_vs_ids,
                },
                "int8": int8,
                "decoding": decoding,
                "text_onnx": text_onnx,
            },
        )
        replace(tmp, out_dir)  # old aside, new in, old deleted: one is always whole
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if verbose:
        print(format_table(rows, tolerance))
        for name, drift in (int8 or {}).items():
            print(
                f"int8 {name}: max |difference| {drift['max_abs_diff']:.3e} "
                f"({drift['relative_drift']:.1%} of the largest output), "
                f"argmax agreement {drift['argmax_agreement']:.1%}"
            )
    return manifest


def _write_onnx_files(model, folder: Path, opset, optimize, quantize) -> dict:
    """Writes `model.onnx` [+ `model.opt.onnx`] [+ `model.int8.onnx`]; returns the manifest's
    `onnx` entry with the fused operators onnxruntime runs in each file."""
    import onnx
    from keras_attn_export.optimize import fuse, quantize_int8, runtime_fused_counts

    write_onnx(model, folder / "model.onnx", opset)
    files = ["model.onnx"]
    if optimize:
        onnx.save(fuse(onnx.load(folder / "model.onnx")), folder / "model.opt.onnx")
        files.append("model.opt.onnx")
    if quantize == "int8":
        quantize_int8(folder / files[-1], folder / "model.int8.onnx")
        files.append("model.int8.onnx")
    return {
        "file": "model.onnx",
        "opset": opset,
        "files": files,
        "fused_ops": {file: runtime_fused_counts(folder / file) for file in files},
    }


def _is_causal_lm(model, task):
    """A `CausalLM`, or a functional model exported with `task="generate"`."""
    from keras_attn.models import CausalLM

    return isinstance(model, CausalLM) or task == "generate"


def _export_decoding(model, folder: Path, opset, tolerance) -> dict:
    """`decode.onnx` for cached generation (tf2onnx of the Keras decode step), and where
    `keras_attn_export.decode_graph` can express the model, `decode_gqa.onnx` (onnxruntime's own
    operators, cache updated in place), the one `serving` decodes with. Each is checked
    two ways: its logits at every step equal the Keras model's on the full prefix, and its
    greedy ids equal Keras `generate()`."""
    import onnxruntime as ort
    from keras_attn_export.decode_graph import supported, write_decode_graph
    from keras_attn_export.decoding import write_decode_onnx
    from keras_attn_serving.generation import BoundCache, empty_cache, gqa_step, session_step

    from keras_attn.decoding import CausalLMRunner

    # The cache holds as many positions as the learned position table; a sinusoidal model has
    # no table, and its cache is as long as the `sequence_length` it was built with.
    runner = CausalLMRunner(model)
    max_length = runner.max_length or model.get_config().get("sequence_length")
    if max_length is None:
        raise ValueError(
            "Exporting generation needs a learned position table (its length bounds the "
            "cache); this model's positions are sinusoidal."
        )
    spec = write_decode_onnx(model, folder / "decode.onnx", max_length, opset)
    session = ort.InferenceSession(str(folder / "decode.onnx"), providers=["CPUExecutionProvider"])
    worst = _check_decoding(
        model, runner, "decode.onnx", session_step(session), lambda b: empty_cache(spec, b),
        max_length, tolerance,
    )  # fmt: skip
    decoding = {"file": "decode.onnx", **spec, "step_logits_max_abs_diff": worst,
                "greedy_equals_keras": True}  # fmt: skip
    reason = supported(runner)
    if reason is not None:
        decoding["gqa"] = {"file": None, "unsupported": reason}
        return decoding
    gqa_spec = write_decode_graph(runner, folder / "decode_gqa.onnx", max_length, opset)
    session = ort.InferenceSession(
        str(folder / "decode_gqa.onnx"), providers=["CPUExecutionProvider"]
    )
    worst = _check_decoding(
        model, runner, "decode_gqa.onnx", gqa_step(session),
        lambda b: BoundCache(session, gqa_spec, b), max_length, tolerance,
    )  # fmt: skip
    decoding["gqa"] = {"file": "decode_gqa.onnx", **gqa_spec, "step_logits_max_abs_diff": worst,
                       "greedy_equals_keras": True}  # fmt: skip
    return decoding


def _check_decoding(model, runner, name, step, new_state, max_length, tolerance):
    """Raises `ParityError` unless a decode graph's `step` (from the state `new_state(batch)`)
    gives the Keras model's logits at every position and Keras `generate()`'s greedy ids;
    returns the largest logits difference."""
    from keras_attn_serving.generation import greedy_decode

    from keras_attn.models import generate

    rng = np.random.default_rng(0)
    vocabulary = _max_token_id(model)
    prompts = [rng.integers(1, vocabulary, size=n).tolist() for n in (3, 5, 1)]
    new_tokens = max(1, min(8, max_length - 5))
    ids = np.asarray([prompts[1] + [0] * new_tokens], "int32")[:, : 5 + new_tokens]
    ids[0, 5:] = rng.integers(1, vocabulary, size=ids.shape[1] - 5)
    full = keras.ops.convert_to_numpy(model(runner.model_inputs(ids), training=False))
    logits, state = step(ids[:, :5], new_state(1), 0)
    worst = max_abs_diff(logits, full[:, 4])
    for t in range(5, ids.shape[1]):
        logits, state = step(ids[:, t : t + 1], state, t)
        worst = max(worst, max_abs_diff(logits, full[:, t]))
    limit = tolerance["logits"] if isinstance(tolerance, dict) else tolerance
    if worst > limit:
        raise ParityError(f"{name} logits differ from Keras by {worst:.3e} > tolerance {limit}")
    onnx_ids = greedy_decode(step, new_state(len(prompts)), prompts, new_tokens,
                             max_length=max_length)  # fmt: skip
    keras_ids = generate(model, prompts, new_tokens)
    if onnx_ids != keras_ids:
        raise ParityError(f"{name} greedy ids {onnx_ids} differ from Keras generate() {keras_ids}")
    return worst


def _export_text_onnx(model, folder: Path, tokenizer, packer, sessions, opset) -> dict:
    """`model.text.onnx`, checked: on ASCII samples its outputs equal `model.onnx` on our
    tokenizer's ids (non-ASCII text may differ; see `keras_attn_export.text_onnx`)."""
    from keras_attn_export.text_onnx import text_session, write_text_onnx

    if tokenizer is None or packer is not None or len(model.inputs) != 1 or not sessions:
        raise ValueError(
            "`strings_in` needs a `tokenizer`, no `packer`, a model with one ids input and "
            f"'onnx' in `formats`. Received: tokenizer={tokenizer is not None}, "
            f"packer={packer is not None}, inputs={len(model.inputs)}, "
            f"onnx written: {bool(sessions)}"
        )
    ids_session = sessions["model.onnx"]
    max_length = _max_sequence_length(model)
    write_text_onnx(folder / "model.onnx", folder / "model.text.onnx", tokenizer, max_length, opset)
    text = text_session(folder / "model.text.onnx")
    (name,) = [spec["name"] for spec in input_specs(model)]
    worst = 0.0
    for line in TEXT_SAMPLES:
        if not line.isascii():
            continue
        ids = tokenizer.tokenize(line).numpy()[None, :max_length].astype("int32")
        expected = run_onnx(ids_session, {name: ids})
        got = dict(zip([o.name for o in text.get_outputs()],
                       text.run(None, {"text": np.array([line])}), strict=True))  # fmt: skip
        worst = max(worst, *(max_abs_diff(got[k], v) for k, v in expected.items()))
    if worst > 1e-5:
        raise ParityError(
            f"model.text.onnx differs from model.onnx on the same text by {worst:.3e}"
        )
    return {"file": "model.text.onnx", "input": "text", "max_abs_diff": worst,
            "custom_ops": "onnxruntime_extensions"}  # fmt: skip
