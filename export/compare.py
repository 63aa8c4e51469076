"""Parity of the exported artifacts with Keras: the sweep of cases, one row per output and
case, int8 drift, and `serve_text` against `serving_default`."""

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import keras
import numpy as np
from keras_attn_export.describe import max_sequence_length, max_token_id
from keras_attn_export.onnx import run_onnx
from keras_attn_export.parity import max_abs_diff, sample_inputs
from keras_attn_export.saved_model import (
    SIGNATURE,
    TEXT_SIGNATURE,
    call_model,
    input_specs,
    load_signature,
)

if TYPE_CHECKING:
    import onnxruntime as ort
    import tensorflow as tf

    from keras_attn.preprocessing import TextPreprocessor

COLUMNS = {"model.onnx": "onnx", "model.opt.onnx": "onnx_opt"}  # parity table columns

TEXT_SAMPLES = [
    "To be, or not to be: that is the question.",
    "Café naïve résumé 日本語 🙂 it´s",
    "a",
]


def text_parity(folder: Path, preprocessor: "TextPreprocessor") -> float:
    """Max |serve_text(strings) - serving_default(the preprocessor's ids of those strings)|;
    0 when they agree."""
    import tensorflow as tf

    serve_text = load_signature(folder, TEXT_SIGNATURE)
    serve_ids = load_signature(folder, SIGNATURE)
    text = tf.constant(TEXT_SAMPLES)
    features = preprocessor(text)
    names = [spec.name for spec in serve_ids.structured_input_signature[1].values()]
    feeds = (
        {names[0]: features["token_ids"]}
        if len(names) == 1
        else {name: features[name] for name in names}
    )
    from_text = serve_text(text=text)
    from_ids = serve_ids(**feeds)
    return max(max_abs_diff(from_text[k].numpy(), from_ids[k].numpy()) for k in from_ids)


def sweep(
    model: keras.Model,
    batch_sizes: Iterable[int],
    sequence_lengths: Iterable[int],
    input_ranges: dict[str, tuple[int, int]] | None = None,
) -> list[tuple[int, int, dict[str, np.ndarray], dict[str, np.ndarray]]]:
    """The parity sweep's cases, Keras run once each: `[(batch, seq, feeds, {output: array})]`.
    Lengths past the model's position table are cut to it (the defaults, 7 and 16, would fail
    a model that takes 8)."""
    specs = input_specs(model)
    limit = max_sequence_length(model)
    if limit is not None:
        sequence_lengths = sorted({min(seq, limit) for seq in sequence_lengths})
    cases = []
    for batch in batch_sizes:
        for seq in sequence_lengths:
            feeds = sample_inputs(specs, batch, seq, max_token_id(model), input_ranges)
            reference = {
                k: keras.ops.convert_to_numpy(v) for k, v in call_model(model, feeds).items()
            }
            cases.append((batch, seq, feeds, reference))
    return cases


def at_real_positions(
    feeds: dict[str, np.ndarray],
    rule: dict | None,
    name: str,
    output: np.ndarray,
    reference: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """`(output, reference)` of output `name`, for a graph that skips padding (`rule`: its
    `keras_attn_export.optimize.padding_rule`) at the positions it keeps when the rule names
    that output (the real positions and each row's first); else whole."""
    if rule is None or name not in rule["outputs"]:
        return output, reference
    kept = np.asarray(feeds[rule["input"]]) != rule["pad_token_id"]
    kept[..., 0] = True
    kept = kept.reshape(-1, kept.shape[-1])  # choices merged into the batch: (B * C, T)
    return output[kept], reference[kept]


def parity_rows(
    cases: Sequence[tuple[int, int, dict[str, np.ndarray], dict[str, np.ndarray]]],
    saved: "tf.types.experimental.ConcreteFunction | None",
    sessions: dict[str, "ort.InferenceSession"],
    padding_rules: dict[str, dict] | None = None,
    branches: dict[str, list["ort.InferenceSession"]] | None = None,
) -> list[dict[str, Any]]:
    """Max-abs differences vs Keras for each output and case of `sweep`, one column per
    artifact (`saved` may be None; `sessions` maps an ONNX file to its session). A file in
    `padding_rules` (a graph that skips padding) is compared at real positions; one in
    `branches` (a graph that picks its q/k/v projection by padding) runs each branch, the
    worst difference reported."""
    padding_rules, branches = padding_rules or {}, branches or {}
    import tensorflow as tf

    rows = []
    for batch, seq, feeds, reference in cases:
        runs = {}
        if saved is not None:
            out = saved(**{k: tf.constant(v) for k, v in feeds.items()})
            runs["saved_model"] = [{k: v.numpy() for k, v in out.items()}]
        rules = {}
        for file, session in sessions.items():
            runs[COLUMNS[file]] = [run_onnx(s, feeds) for s in branches.get(file, [session])]
            rules[COLUMNS[file]] = padding_rules.get(file)
        for name, ref in reference.items():
            row = {"output": name, "batch": batch, "seq": seq}
            for artifact, outs in runs.items():
                rule = rules.get(artifact)
                diffs = [max_abs_diff(*at_real_positions(feeds, rule, name, out[name], ref))
                         for out in outs]  # fmt: skip
                row[f"{artifact}_vs_keras"] = float(np.max(diffs))  # NaN stays NaN
            rows.append(row)
    return rows


def quantization_drift(
    cases: Sequence[tuple[int, int, dict[str, np.ndarray], dict[str, np.ndarray]]],
    session: "ort.InferenceSession",
    padding_rule: dict | None = None,
) -> dict[str, dict[str, float]]:
    """How far int8 outputs move from Keras over the `sweep` cases: per output, the largest
    absolute difference, that difference relative to the largest |Keras output|, and the
    fraction of positions whose argmax over the last axis is unchanged (real positions only
    for a graph that skips padding)."""
    report: dict[str, dict[str, Any]] = {}
    for _, _, feeds, reference in cases:
        quantized = run_onnx(session, feeds)
        for name, ref in reference.items():
            got, ref = at_real_positions(feeds, padding_rule, name, quantized[name], ref)
            ref, got = ref.astype("float64"), got.astype("float64")
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
