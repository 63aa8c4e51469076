"""The ONNX files beside the SavedModel, each written and then checked against Keras:
`model.onnx` (+ fused `model.opt.onnx`, + `model.int8.onnx`), the key/value-cache decode
graphs of a causal LM, and the text graph (tokenizer as onnxruntime-extensions operators)."""

import contextlib
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import keras
import numpy as np
from keras_attn_export import qkv_switch
from keras_attn_export.compare import TEXT_SAMPLES
from keras_attn_export.describe import max_sequence_length, max_token_id, model_max_length
from keras_attn_export.onnx import run_onnx, write_onnx
from keras_attn_export.parity import ParityError, max_abs_diff
from keras_attn_export.saved_model import input_specs
from keras_attn_export.weight_only import quality_ids
from keras_attn_export.weight_only_graphs import write_weight_only_graph
from keras_attn_serving.generation import (
    BoundCache,
    decode_ids,
    empty_cache,
    gqa_step,
    session_step,
)

from keras_attn.models import generate
from keras_attn.models.cached import CachedCausalLM, cached_causal_lm, model_inputs
from keras_attn.tokenizers import BytePairTokenizer, WordPieceTokenizer

if TYPE_CHECKING:
    import onnxruntime as ort

    from keras_attn.preprocessing import SegmentPacker, StartEndPacker


def write_onnx_files(model: keras.Model, folder: Path, opset: int, optimize: bool) -> dict:
    """Writes `model.onnx` [+ `model.opt.onnx`]; returns the manifest's `onnx` entry with the
    fused operators onnxruntime runs in each file (`write_int8` adds the int8 file). The fused
    file, when written, is the one served (`file`); `unpadded` names the files that skip
    padding and which input says where it is; `qkv_switch` the files that also project q, k
    and v on real tokens where a batch is mostly padding, with the threshold measured here."""
    import onnx
    from keras_attn_export.optimize import count_ops, fuse, padding_rule, runtime_optimized

    write_onnx(model, folder / "model.onnx", opset)
    files, unpadded, switches = ["model.onnx"], {}, {}
    if optimize:
        fused = fuse(onnx.load(folder / "model.onnx"))
        if (rule := padding_rule(fused)) is not None:
            unpadded["model.opt.onnx"] = rule
            unpacked = lambda: fuse(onnx.load(folder / "model.onnx"), pack_qkv=False)  # noqa: E731
            fused, record = qkv_switch.switch_qkv(model, unpacked, fused, rule)
            if record is not None:
                switches["model.opt.onnx"] = record
        onnx.save(fused, folder / "model.opt.onnx")
        files.append("model.opt.onnx")
    fused_ops = {}
    for file in files:  # of a switched file, the packed branch; its record, the other
        optimized = runtime_optimized(folder / file)
        fused_ops[file] = count_ops(optimized)
        if file in switches:
            switches[file]["unpadded_fused_ops"] = count_ops(optimized, "unpadded")
    return {
        "file": files[-1],
        "opset": opset,
        "files": files,
        "fused_ops": fused_ops,
        "unpadded": unpadded,
        "qkv_switch": switches,
    }


def write_int8(
    folder: Path,
    onnx_info: dict,
    optimize: bool,
    cases: Sequence[tuple[int, int, dict[str, np.ndarray], dict[str, np.ndarray]]],
    requested: str | None = None,
) -> tuple[dict[str, Any], dict[str, dict[str, float]]]:
    """Writes `model.int8.onnx` and adds it to `onnx_info`; returns `(quantization, drift)`,
    the manifest's `quantization` and `int8` entries.

    With `requested` (`"s8"`/`"u8"`) that weight type is used and its drift reported. Without,
    both are written, each is run on the parity `cases` (drift against Keras, median time on
    the largest case), and `keras_attn_export.hardware.pick` keeps the faster one within the
    drift bound; both measurements go into the manifest.
    """
    import onnx
    import onnxruntime as ort
    from keras_attn_export.compare import quantization_drift
    from keras_attn_export.hardware import (
        INT8_WEIGHTS,
        largest_feeds,
        pick,
        quantization_entry,
        time_session,
        worst_drift,
    )
    from keras_attn_export.optimize import fuse, padding_rule, quantize_int8, runtime_fused_counts

    target = folder / "model.int8.onnx"
    rule = None
    with tempfile.TemporaryDirectory() as scratch:
        source = folder / "model.onnx"
        if optimize:  # fused, with q, k, v left as three matmuls to quantize
            source = Path(scratch) / "unpacked.onnx"
            fused = fuse(onnx.load(folder / "model.onnx"), pack_qkv=False)
            rule = padding_rule(fused)
            onnx.save(fused, source)
        measured, drifts, float_matmuls = {}, {}, []
        for weights in (requested,) if requested else INT8_WEIGHTS:
            path = Path(scratch) / f"{weights}.onnx"
            float_matmuls = quantize_int8(source, path, weights)
            session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            drifts[weights] = quantization_drift(cases, session, rule)
            measured[weights] = {
                "relative_drift": worst_drift(drifts[weights]),
                "ms": time_session(session, largest_feeds(cases)),
            }
        chosen = requested or pick(measured)
        Path(scratch, f"{chosen}.onnx").replace(target)
    quantization = quantization_entry(chosen, "argument" if requested else "measurement", measured)
    quantization["float_matmuls"] = float_matmuls
    onnx_info["files"].append(target.name)
    onnx_info["fused_ops"][target.name] = runtime_fused_counts(target)
    if rule is not None:
        onnx_info["unpadded"][target.name] = rule
    return quantization, drifts[chosen]


def is_causal_lm(model: keras.Model, task: str | None) -> bool:
    """A model that owns its cached call (`CausalLM`, any `CachedCausalLM`), or a functional
    model exported with `task="generate"`."""
    return isinstance(model, CachedCausalLM) or task == "generate"


def export_decoding(
    model: keras.Model,
    folder: Path,
    opset: int,
    tolerance: float | dict[str, float],
    tf2onnx_graph: bool = True,
    weights: dict[str, Any] | None = None,
    tokenizer: Any = None,
    max_length: int | None = None,
) -> dict:
    """`decode.onnx` for cached generation (tf2onnx of the Keras decode step), and where
    `keras_attn_export.decode_graph` can express the model, `decode_gqa.onnx` (onnxruntime's own
    operators, cache updated in place), the one `serving` decodes with. Each is checked
    two ways: its logits at every step equal the Keras model's on the full prefix, and its
    greedy ids equal Keras `generate()`. Without `tf2onnx_graph`, `decode_gqa.onnx` alone
    (written from the weights, never traced: what exports at real sizes). With `weights`
    (`{"weights": "int4" | "int8", "block_size", "accuracy_level"}`), the decode graph
    served is `decode_gqa.int4.onnx` (`.int8`), its cost scored on held-out text with
    `tokenizer` (`keras_attn_export.weight_only`). `max_length`: the cache's length, at most
    the model's (`check_max_length`); None for the model's."""
    import onnxruntime as ort
    from keras_attn_export.decode_graph import supported
    from keras_attn_export.decoding import write_decode_onnx

    # The cache holds as many positions as the learned position table; a sinusoidal model has
    # no table, and its cache is as long as the `sequence_length` it was built with.
    lm = cached_causal_lm(model)
    max_length = max_length or model_max_length(model)
    if max_length is None:
        raise ValueError(
            "Exporting generation needs a learned position table (its length bounds the "
            "cache); this model's positions are sinusoidal."
        )
    pad_token_id = 0 if lm.zero_is_padding else None
    reason = supported(lm)
    if not tf2onnx_graph and reason is not None:
        raise ValueError(
            "formats=['generation'] writes decode_gqa.onnx alone, which cannot express "
            f"this model: {reason}. Export it with formats=['onnx']."
        )
    if weights is not None and reason is not None:
        raise ValueError(
            f"`weights={weights['weights']!r}` quantizes decode_gqa.onnx, which cannot express "
            f"this model: {reason}"
        )
    # Keras's answers first, once for both graphs: its `generate()` then never runs beside an
    # onnxruntime session holding a second copy of the weights.
    reference = _keras_reference(model, max_length, pad_token_id)
    if weights is not None:
        ids, source = quality_ids(tokenizer, max_token_id(model), max_length)
        full = keras.ops.convert_to_numpy(model(model_inputs(model, ids), training=False))
        reference["quality"] = {"ids": ids, "full": full, "source": source}
    if not tf2onnx_graph:
        gqa = _gqa_graph(lm, folder, max_length, opset, tolerance, reference, weights)
        return {"file": None, "pad_token_id": pad_token_id, "gqa": gqa}
    spec = write_decode_onnx(model, folder / "decode.onnx", max_length, opset)
    session = ort.InferenceSession(str(folder / "decode.onnx"), providers=["CPUExecutionProvider"])
    worst = _check_decoding(
        "decode.onnx", session_step(session), lambda b: empty_cache(spec, b), tolerance, reference
    )
    del session
    decoding = {"file": "decode.onnx", **spec, "step_logits_max_abs_diff": worst,
                "greedy_equals_keras": True, "pad_token_id": pad_token_id}  # fmt: skip
    if reason is not None:
        decoding["gqa"] = {"file": None, "unsupported": reason}
        return decoding
    decoding["gqa"] = _gqa_graph(lm, folder, max_length, opset, tolerance, reference, weights)
    return decoding


def _gqa_graph(
    lm: CachedCausalLM,
    folder: Path,
    max_length: int,
    opset: int,
    tolerance: float | dict[str, float],
    reference: dict[str, Any],
    weights: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Writes `decode_gqa.onnx` and checks it against Keras; the manifest's `gqa` entry.
    With `weights`, the float32 graph is checked in a scratch folder and deleted, and the one
    written beside the others is its weight-only quantized twin (same builder), scored."""
    from keras_attn_export.decode_graph import write_decode_graph

    scratch = tempfile.TemporaryDirectory(dir=folder) if weights else contextlib.nullcontext()
    with scratch as where:
        path = Path(where or folder) / "decode_gqa.onnx"
        gqa_spec = write_decode_graph(lm, path, max_length, opset)
        worst = _check_gqa(path, gqa_spec, tolerance, reference)
    entry = {"file": "decode_gqa.onnx", **gqa_spec, "step_logits_max_abs_diff": worst,
             "greedy_equals_keras": True}  # fmt: skip
    if weights is None:
        return entry
    return entry | write_weight_only_graph(lm, folder, max_length, opset, reference, weights)


def _check_gqa(
    path: Path, spec: dict[str, Any], tolerance: float | dict[str, float], reference: dict
) -> float:
    """`_check_decoding` of the float32 `decode_gqa.onnx` at `path`; its session is gone when
    this returns."""
    import onnxruntime as ort

    # Unpacked weights: onnxruntime then maps the external data file instead of copying it
    # into packed buffers (+2.5 GB for Qwen2.5-0.5B's shape; a check of a few steps needs no
    # packing's speed).
    options = ort.SessionOptions()
    options.add_session_config_entry("session.disable_prepacking", "1")
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return _check_decoding(
        "decode_gqa.onnx", gqa_step(session), lambda b: BoundCache(session, spec, b),
        tolerance, reference,
    )  # fmt: skip


def _keras_reference(
    model: keras.Model, max_length: int, pad_token_id: int | None
) -> dict[str, Any]:
    """What every decode graph must reproduce: 5 prompt ids then up to 8 more, with Keras's
    logits at each position, and Keras `generate()`'s greedy ids for three prompts."""
    rng = np.random.default_rng(0)
    vocabulary = max_token_id(model)
    prompts = [rng.integers(1, vocabulary, size=n).tolist() for n in (3, 5, 1)]
    new_tokens = max(1, min(8, max_length - 5))
    ids = np.asarray([prompts[1] + [0] * new_tokens], "int32")[:, : 5 + new_tokens]
    ids[0, 5:] = rng.integers(1, vocabulary, size=ids.shape[1] - 5)
    full = keras.ops.convert_to_numpy(model(model_inputs(model, ids), training=False))
    keras_ids = generate(model, prompts, new_tokens)
    return {
        "ids": ids, "full": full, "prompts": prompts, "new_tokens": new_tokens,
        "keras_ids": keras_ids, "max_length": max_length, "pad_token_id": pad_token_id,
    }  # fmt: skip


def _check_decoding(
    name: str,
    step: Any,
    new_state: Any,
    tolerance: float | dict[str, float],
    reference: dict[str, Any],
) -> float:
    """Raises `ParityError` unless a decode graph's `step` (from the state `new_state(batch)`)
    gives the Keras model's logits at every position and Keras `generate()`'s greedy ids
    (`reference`, from `_keras_reference`); returns the largest logits difference."""
    ids, full = reference["ids"], reference["full"]
    logits, state = step(ids[:, :5], new_state(1), 0)
    worst = max_abs_diff(logits, full[:, 4])
    for t in range(5, ids.shape[1]):
        logits, state = step(ids[:, t : t + 1], state, t)
        worst = max(worst, max_abs_diff(logits, full[:, t]))
    limit = tolerance["logits"] if isinstance(tolerance, dict) else tolerance
    if worst > limit:
        raise ParityError(f"{name} logits differ from Keras by {worst:.3e} > tolerance {limit}")
    prompts = reference["prompts"]
    onnx_ids = decode_ids(step, new_state(len(prompts)), prompts, reference["new_tokens"],
                          pad_token_id=reference["pad_token_id"],
                          max_length=reference["max_length"])  # fmt: skip
    if onnx_ids != reference["keras_ids"]:
        raise ParityError(
            f"{name} greedy ids {onnx_ids} differ from Keras generate() {reference['keras_ids']}"
        )
    return worst


def export_text_onnx(
    model: keras.Model,
    folder: Path,
    tokenizer: "WordPieceTokenizer | BytePairTokenizer | None",
    packer: "StartEndPacker | SegmentPacker | None",
    sessions: dict[str, "ort.InferenceSession"],
    opset: int,
) -> dict:
    """`model.text.onnx`, checked: on ASCII samples its outputs equal `model.onnx` on our
    tokenizer's ids (non-ASCII text may differ; see `keras_attn_export.text_onnx`)."""
    from keras_attn_export.text_onnx import gpt2_compatible, text_session, write_text_onnx

    why = None
    if isinstance(tokenizer, BytePairTokenizer):
        why = gpt2_compatible(tokenizer)
    elif tokenizer is not None and not isinstance(tokenizer, WordPieceTokenizer):
        why = "only WordPiece and GPT-2-style BPE have onnxruntime-extensions operators"
    if why is not None:
        raise ValueError(
            "`strings_in` writes the tokenizer as an onnxruntime-extensions operator; it "
            f"cannot for this {type(tokenizer).__name__}: {why}"
        )
    if tokenizer is None or packer is not None or len(model.inputs) != 1 or not sessions:
        raise ValueError(
            "`strings_in` needs a `tokenizer`, no `packer`, a model with one ids input and "
            f"'onnx' in `formats`. Received: tokenizer={tokenizer is not None}, "
            f"packer={packer is not None}, inputs={len(model.inputs)}, "
            f"onnx written: {bool(sessions)}"
        )
    ids_session = sessions["model.onnx"]
    max_length = max_sequence_length(model)
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
