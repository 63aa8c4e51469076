"""Weight-only quantized decode graphs (`export_model(..., weights="int4" | "int8")`).

Each projection of `decode_gqa.onnx` becomes onnxruntime's `MatMulNBits` (com.microsoft): its
weights stored as 4- or 8-bit integers in blocks of `block_size` along the input axis, one
float32 scale per block (symmetric: no zero points), dequantized inside the matmul kernel.
The token embedding becomes `GatherBlockQuantized` over the same integers, so a tied output
projection and the embedding share one quantized table.

The integers are onnxruntime's own: `DefaultWeightOnlyQuantizer.qbits_block_quant`, the
routine `MatMulNBitsQuantizer` runs on every MatMul of a model, applied here to each weight as
the graph is written (the whole-model tool would hold a float32 copy of every weight; at
Qwen2.5-0.5B's shape that is 2 GB more than this). `tests/export/test_weight_only.py` checks
that both give the same bytes.

`accuracy_level` is how the kernel multiplies: 1 in float32, 4 with the activations quantized
to int8 per block (VNNI/AMX dot products where the CPU has them). Which is faster depends on
the CPU and on the rows multiplied; without one given, the export times both on the model's
feed-forward shape, for one row (a decode step) and for a prompt's rows. Where a different
level is faster for prompts (on a 2-core AVX-512 VNNI Xeon: 4 for a step, 1 for 512 prompt
tokens, whose prefill it makes 1.25x faster), the export also writes the prefill twin,
`prefill_gqa.int4.onnx`: the same graph and weights file, the other level, which the server
runs for prompts of `min_tokens` or more.
"""

import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from keras_attn_export.decode_graph import supported
from keras_attn_export.onnx import run_onnx

from keras_attn.hardware import cpu_flags
from keras_attn.models.cached import cached_causal_lm

WEIGHTS = ("float32", "int8", "int4")
BITS = {"int8": 8, "int4": 4}
ACCURACY_LEVELS = (1, 4)  # float32 activations; int8 activations
# onnxruntime-genai's and llama.cpp's (Q4_0, Q8_0) block: 32 weights share a scale.
DEFAULT_BLOCK_SIZE = 32
# Rows of the prompt-sized timing, and the fewest prompt tokens a prefill twin may run.
PROMPT_ROWS = 256
CHUNK_ROWS = 64
# A prefill twin is written where another level takes under this share of the step level's
# time for a prompt's rows (a second session holds about 0.85x the weights file again).
TWIN_MARGIN = 0.9
# Positions of held-out text the quantized graph is scored on against the float model.
QUALITY_POSITIONS = 64
# Held-out text for the quality check (no model in this project trains on it).
HELD_OUT_TEXT = (
    "The lighthouse keeper climbed the spiral stairs each evening, counting the steps aloud "
    "as his father had taught him. Two hundred and twelve, always two hundred and twelve. "
    "At the top he trimmed the wick, polished the lens with a square of soft cloth, and "
    "watched the first ships turn toward the harbour as the lamp caught and the beam swept "
    "out across the grey water."
)


@dataclass(frozen=True)
class WeightOnly:
    """How a graph's weights are quantized: `bits` (4 or 8) per weight, `block_size` weights
    per float32 scale along the input axis, and the kernel's `accuracy_level`."""

    bits: int
    block_size: int
    accuracy_level: int

    def quantize(self, kernel: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """A `(K, N)` kernel as MatMulNBits' `B` `(N, K / block, block · bits / 8)` uint8 and
        `scales` `(N, K / block)` float32 (K padded to whole blocks with zeros)."""
        from onnxruntime.quantization.matmul_nbits_quantizer import (
            DefaultWeightOnlyQuantConfig,
            DefaultWeightOnlyQuantizer,
        )

        config = DefaultWeightOnlyQuantConfig(
            block_size=self.block_size, is_symmetric=True, bits=self.bits,
            accuracy_level=self.accuracy_level,
        )  # fmt: skip
        kernel = np.ascontiguousarray(kernel, np.float32)
        packed, scales, _ = DefaultWeightOnlyQuantizer(config).qbits_block_quant(kernel)
        return packed, scales

    def matmul_attributes(self, k: int, n: int) -> dict[str, int]:
        """MatMulNBits' attributes for a `(K, N)` kernel."""
        return {"K": k, "N": n, "bits": self.bits, "block_size": self.block_size,
                "accuracy_level": self.accuracy_level}  # fmt: skip


def _is_int(value: Any) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def check_weights(weights: str | None, block_size: int, accuracy_level: int | None) -> None:
    """`ValueError` naming the argument unless the three describe a graph onnxruntime runs."""
    if weights is not None and weights not in WEIGHTS:
        raise ValueError(
            f"`weights` must be one of {WEIGHTS} or None. Received: weights={weights!r}"
        )
    # MatMulNBits' constraint: a power of two, at least 16.
    if not _is_int(block_size) or block_size < 16 or block_size & (block_size - 1):
        raise ValueError(
            "`weights_block_size` must be a power of two, at least 16. Received: "
            f"weights_block_size={block_size!r}"
        )
    if accuracy_level is not None and not (
        _is_int(accuracy_level) and accuracy_level in ACCURACY_LEVELS
    ):
        raise ValueError(
            f"`weights_accuracy_level` must be one of {ACCURACY_LEVELS} (float32 or int8 "
            f"activations) or None (measured). Received: weights_accuracy_level={accuracy_level!r}"
        )
    if accuracy_level is not None and weights in (None, "float32"):
        raise ValueError(
            "`weights_accuracy_level` applies to int8 or int4 `weights`. Received: "
            f"weights={weights!r}, weights_accuracy_level={accuracy_level!r}"
        )


def check_target(
    model: Any, causal_lm: bool, task: str | None, formats: Any, request: dict | None
) -> None:
    """`ValueError` unless `model` is a causal LM (`causal_lm`) whose decode graph the
    export writes (`"onnx"` or `"generation"` in `formats`) and `decode_graph` can express:
    checked before anything is traced."""
    if request is None:
        return
    weights = request["weights"]
    if not (causal_lm and ({"onnx", "generation"} & set(formats))):
        raise ValueError(
            f"`weights={weights!r}` quantizes a causal LM's decode graph: it needs a causal LM "
            f"(this model's task is {task!r}) and 'onnx' or 'generation' in `formats`. "
            f"Received: formats={sorted(formats)}"
        )
    lm = cached_causal_lm(model)
    reason = supported(lm)
    width = int(lm.token_embedding.embeddings.shape[-1])
    if request["block_size"] > width:
        raise ValueError(
            f"`weights_block_size` is wider than the model ({width}): every block would be "
            f"mostly padding. Received: weights_block_size={request['block_size']}"
        )
    if reason is not None:
        raise ValueError(
            f"`weights={weights!r}` quantizes decode_gqa.onnx, which cannot express this "
            f"model: {reason}"
        )


def weight_only_request(
    weights: str | None, block_size: int, accuracy_level: int | None
) -> dict[str, Any] | None:
    """`export_model`'s three weight arguments, checked: what `export_decoding` takes, or
    None for float32 weights."""
    check_weights(weights, block_size, accuracy_level)
    if weights in (None, "float32"):
        return None
    return {"weights": weights, "block_size": block_size, "accuracy_level": accuracy_level}


def _matmul_session(weight_only: WeightOnly, k: int, n: int) -> Any:
    """A session of one `(K, N)` MatMulNBits over random weights."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    kernel = np.random.default_rng(0).standard_normal((k, n)).astype(np.float32)
    packed, scales = weight_only.quantize(kernel)
    attributes: dict[str, Any] = weight_only.matmul_attributes(k, n)
    node = helper.make_node("MatMulNBits", ["x", "b", "scales"], ["y"], domain="com.microsoft",
                            **attributes)  # fmt: skip
    graph = helper.make_graph(
        [node], "matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", n])],
        [numpy_helper.from_array(packed, "b"), numpy_helper.from_array(scales, "scales")],
    )  # fmt: skip
    model = helper.make_model(
        graph, ir_version=8,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
    )  # fmt: skip
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def measure_accuracy_levels(
    bits: int, block_size: int, k: int, n: int, repeats: int = 15
) -> dict[int, dict[str, float]]:
    """Median milliseconds of a `(K, N)` MatMulNBits (the feed-forward's first projection) at
    each accuracy level, for one row (a decode step), 64 rows (a prompt's chunk) and 256
    rows (a prompt). The levels take turns, run by run, so that a slow spell of a shared
    machine falls on both rather than on whichever was being timed."""
    rng = np.random.default_rng(1)
    feeds = {
        name: {"x": rng.standard_normal((m, k)).astype(np.float32)}
        for name, m in (
            ("decode_ms", 1),
            ("chunk_64_ms", CHUNK_ROWS),
            ("prompt_256_ms", PROMPT_ROWS),
        )
    }
    sessions = {
        lv: _matmul_session(WeightOnly(bits, block_size, lv), k, n) for lv in ACCURACY_LEVELS
    }
    for session in sessions.values():  # warm-ups: weights packed, buffers sized
        for feed in feeds.values():
            run_onnx(session, feed)
    times: dict[int, dict[str, list[float]]] = {lv: {name: [] for name in feeds} for lv in sessions}
    for _ in range(repeats):
        for level, session in sessions.items():
            for name, feed in feeds.items():
                start = time.perf_counter()
                run_onnx(session, feed)
                times[level][name].append((time.perf_counter() - start) * 1e3)
    return {
        lv: {name: statistics.median(runs) for name, runs in by_rows.items()}
        for lv, by_rows in times.items()
    }


def choose(
    weights: str, block_size: int, accuracy_level: int | None, shape: tuple[int, int]
) -> tuple[WeightOnly, dict[str, Any]]:
    """The `WeightOnly` to write and the manifest's record of how it was chosen: the given
    accuracy level, or the one whose decode step (one row) is fastest on this CPU. Measured,
    the record's `prefill` names another level where it is faster for a prompt's rows by
    more than the timings' noise (`TWIN_MARGIN`): `{"accuracy_level", "min_tokens"}`, from
    64 tokens where it is that much faster at 64 rows too, else from 256; for
    `write_prefill_twin`."""
    bits = BITS[weights]
    if accuracy_level is not None:
        chosen = WeightOnly(bits, block_size, accuracy_level)
        return chosen, {"chosen_by": "argument", "candidates": {}}
    measured = measure_accuracy_levels(bits, block_size, *shape)
    level = min(measured, key=lambda lv: (measured[lv]["decode_ms"], -lv))
    how: dict[str, Any] = {
        "chosen_by": "measurement",
        "candidates": {str(lv): m for lv, m in measured.items()},
        "measured_shape": list(shape),
    }
    prompt = min(measured, key=lambda lv: (measured[lv]["prompt_256_ms"], lv != level))

    def clearly_faster(rows: str) -> bool:  # past the timings' noise: worth a second session
        return measured[prompt][rows] < TWIN_MARGIN * measured[level][rows]

    if prompt != level and clearly_faster("prompt_256_ms"):
        how["prefill"] = {"accuracy_level": prompt,
                          "min_tokens": CHUNK_ROWS if clearly_faster("chunk_64_ms")
                          else PROMPT_ROWS}  # fmt: skip
    return WeightOnly(bits, block_size, level), how


def write_prefill_twin(source: Path, path: Path, accuracy_level: int) -> None:
    """Writes the graph at `source` again at `path`, beside it, with every MatMulNBits at
    `accuracy_level`: the same nodes, and the same external data file where the weights are
    in one (not loaded, nor copied; weights inside the graph are copied with it)."""
    import onnx

    model = onnx.load(str(source), load_external_data=False)
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            for attribute in node.attribute:
                if attribute.name == "accuracy_level":
                    attribute.i = accuracy_level
    onnx.save(model, str(path))
    onnx.checker.check_model(str(path))


def quality_ids(tokenizer: Any, vocabulary: int, max_length: int) -> tuple[np.ndarray, str]:
    """`(1, n)` int32 ids the quantized graph is scored on: `HELD_OUT_TEXT` through the
    model's tokenizer, or, without one, seeded random ids (what the manifest then says)."""
    n = max(2, min(QUALITY_POSITIONS, max_length))
    if tokenizer is not None:
        ids = np.asarray(tokenizer.tokenize(HELD_OUT_TEXT)).reshape(-1)[:n]
        if len(ids) >= 2 and int(ids.max()) < vocabulary:
            return ids[None].astype(np.int32), "held-out text"
    ids = np.random.default_rng(2).integers(1, vocabulary, size=(1, n))
    return ids.astype(np.int32), "random ids"


def quality(step: Any, state: Any, ids: np.ndarray, reference: np.ndarray) -> dict[str, Any]:
    """The quantized graph's cost against the float model's logits `reference` `(1, n,
    vocab)` on `ids`, teacher-forced one position a step: how often its most likely next
    token is the float model's, and the largest logit difference."""
    agree, worst = 0, 0.0
    for t in range(ids.shape[1]):
        logits, state = step(ids[:, t : t + 1], state, t)
        expected = reference[:, t]
        agree += int(np.argmax(logits, -1)[0] == np.argmax(expected, -1)[0])
        worst = max(worst, float(np.max(np.abs(logits - expected))))
    return {"positions": int(ids.shape[1]), "top1_agreement": agree / ids.shape[1],
            "max_abs_logit_diff": worst}  # fmt: skip


def manifest_entry(
    weights: str, weight_only: WeightOnly, how: dict[str, Any], measured: dict[str, Any]
) -> dict[str, Any]:
    """The manifest's `decoding.gqa.weights`."""
    return {
        "type": weights,
        "bits": weight_only.bits,
        "block_size": weight_only.block_size,
        "accuracy_level": weight_only.accuracy_level,
        "symmetric": True,
        "cpu_flags": cpu_flags(),
        **how,
        "quality": measured,
    }


def summary(file: str, entry: Any) -> str:
    """One line on a quantized decode graph's cost, for `export_model`'s report."""
    cost = entry["quality"]
    return (
        f"{file}: top-1 agreement {cost['top1_agreement']:.1%} with the float model over "
        f"{cost['positions']} positions of {cost['source']}, worst logit difference "
        f"{cost['max_abs_logit_diff']:.3g} ({entry['type']}, block {entry['block_size']}, "
        f"accuracy level {entry['accuracy_level']} by {entry['chosen_by']})"
    )
