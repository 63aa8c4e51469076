"""`export_model`: one call from a trained Keras model to a verified artifact folder."""

import datetime
import json
import shutil
import tempfile
from pathlib import Path

import keras

from export.manifest import write_manifest
from export.onnx import check_opset, run_onnx, write_onnx
from export.parity import (
    DEFAULT_BATCH_SIZES,
    DEFAULT_SEQUENCE_LENGTHS,
    ParityError,
    check,
    format_table,
    max_abs_diff,
    sample_inputs,
)
from export.saved_model import (
    SIGNATURE,
    TEXT_SIGNATURE,
    input_specs,
    load_signature,
    output_names,
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


def _smallest_layer_attribute(model, name):
    """Smallest integer `layer.<name>` over the model's layers, or None."""
    values = [getattr(layer, name, None) for layer in model.layers]
    values = [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
    return min(values) if values else None


def _max_token_id(model):
    """Ids to sample in the parity check: below the smallest vocabulary in the model."""
    return _smallest_layer_attribute(model, "vocabulary_size") or 2


def _max_sequence_length(model):
    """The longest input a learned position table allows, or None."""
    return _smallest_layer_attribute(model, "sequence_length")


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


def parity_rows(model, saved, session, batch_sizes, sequence_lengths):
    """Max-abs differences vs Keras for each output, batch size and sequence length."""
    import tensorflow as tf

    specs = input_specs(model)
    names = output_names(model)
    rows = []
    for batch in batch_sizes:
        for seq in sequence_lengths:
            feeds = sample_inputs(specs, batch, seq, _max_token_id(model))
            ordered = [feeds[s["name"]] for s in specs]
            keras_out = model(ordered if len(ordered) > 1 else ordered[0], training=False)
            keras_out = keras_out if isinstance(keras_out, (list, tuple)) else [keras_out]
            keras_out = dict(zip(names, keras_out, strict=True))
            saved_out = saved(**{k: tf.constant(v) for k, v in feeds.items()})
            onnx_out = run_onnx(session, feeds)
            for name in names:
                ref = keras.ops.convert_to_numpy(keras_out[name])
                rows.append(
                    {
                        "output": name,
                        "batch": batch,
                        "seq": seq,
                        "saved_model_vs_keras": max_abs_diff(saved_out[name].numpy(), ref),
                        "onnx_vs_keras": max_abs_diff(onnx_out[name], ref),
                    }
                )
    return rows


def export_model(
    model: keras.Model,
    out_dir,
    tokenizer=None,
    packer=None,
    opset: int = 17,
    tolerance: float = 1e-4,
    batch_sizes=DEFAULT_BATCH_SIZES,
    sequence_lengths=DEFAULT_SEQUENCE_LENGTHS,
    overwrite: bool = True,
    verbose: bool = True,
) -> dict:
    """Exports `model` to `out_dir` as a SavedModel and ONNX, checked for parity.

    The folder holds `saved_model/`, `model.onnx`, `tokenizer/` (when a tokenizer is given)
    and `manifest.json` (inputs and outputs with named dynamic axes, opset, tool versions,
    sha256 of every file, and the parity table). It is written to a temporary folder and
    renamed into place only when parity holds, so a failed export leaves nothing behind.

    Args:
        model: a functional Keras model (e.g. `keras_attn.models.build_causal_lm`).
        out_dir: destination folder.
        tokenizer: optional `WordPieceTokenizer`; its vocabulary is exported with the model,
            and the SavedModel gets a `serve_text` signature taking raw strings.
        packer: optional packer (e.g. `StartEndPacker`) between tokenizer and model in
            `serve_text`; without one, rows are padded with 0 to the longest.
        opset: ONNX opset, 13 to 18.
        tolerance: largest max-abs difference allowed between Keras and each artifact.
        batch_sizes, sequence_lengths: the parity sweep; integer inputs get padded rows.
        overwrite: replace an existing `out_dir`.
    Returns:
        the manifest, as a dict.
    Raises:
        ParityError: with the table, when an artifact differs beyond `tolerance`.
    """
    import onnxruntime as ort

    from keras_attn.tokenizers import WordPieceTokenizer

    check_opset(opset)
    if tokenizer is not None and not isinstance(tokenizer, WordPieceTokenizer):
        raise ValueError(
            "`tokenizer` must be a WordPieceTokenizer: the server-side tokenizer files "
            f"exist for WordPiece only so far. Received: {type(tokenizer).__name__}"
        )
    if not isinstance(model, keras.Model) or not hasattr(model, "inputs") or not model.inputs:
        raise ValueError(f"`model` must be a built functional keras.Model. Received: {model!r}")
    out_dir = Path(out_dir)
    if out_dir.exists() and not overwrite:
        raise ValueError(f"`out_dir` exists and overwrite=False. Received: out_dir={out_dir}")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the artifact is meant to be read by servers
    try:
        assets = _write_tokenizer(tokenizer, tmp / "tokenizer") if tokenizer is not None else []
        max_length = _max_sequence_length(model)
        signatures = write_saved_model(
            model, tmp / "saved_model", assets, tokenizer, packer, max_length
        )
        write_onnx(model, tmp / "model.onnx", opset)
        session = ort.InferenceSession(str(tmp / "model.onnx"), providers=["CPUExecutionProvider"])
        rows = parity_rows(
            model, load_signature(tmp / "saved_model"), session, batch_sizes, sequence_lengths
        )
        worst = check(rows, tolerance)
        strings_vs_ids = None
        if tokenizer is not None:
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
                "onnx": {"file": "model.onnx", "opset": opset},
                "saved_model": {"folder": "saved_model", "signatures": signatures},
                "tokenizer": "tokenizer" if tokenizer is not None else None,
                "max_sequence_length": _max_sequence_length(model),
                "versions": _versions(),
                "parity": {
                    "tolerance": tolerance,
                    "max_abs_diff": worst,
                    "rows": rows,
                    "serve_text_vs_serving_default": strings_vs_ids,
                },
            },
        )
        if out_dir.exists():
            shutil.rmtree(out_dir)
        tmp.rename(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if verbose:
        print(format_table(rows, tolerance))
    return manifest
