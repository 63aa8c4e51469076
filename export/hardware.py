"""The int8 weight type, chosen by measurement on the exporting machine and recorded in the
manifest beside both measurements and the CPU flags.

A flag table was tried first (signed weights where the CPU has VNNI or AMX, else unsigned) and
was wrong on an AVX2-only EPYC: there signed weights ran MiniLM 1.70x float32 at batch 32 with
a worst sentence cosine of 0.9895, the unsigned ones the table picked 1.16x (0.9918); on the
test classifier the same signed weights drifted 69% of the largest logit. Which type is both
accurate and fast depends on the CPU and the model, so the export quantizes both ways, runs
each on the parity inputs, and keeps the faster of those within the drift bound.
"""

import statistics
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from keras_attn_export.onnx import run_onnx

from keras_attn.hardware import cpu_flags

if TYPE_CHECKING:
    import onnxruntime as ort

INT8_WEIGHTS = ("s8", "u8")
# Largest relative drift (max |int8 - Keras| over the largest |Keras output|, worst output) a
# weight type may show to be chosen for speed; past it, the more accurate type is kept.
DRIFT_BOUND = 0.1


def check_int8_weights(requested: str | None) -> None:
    if requested is not None and requested not in INT8_WEIGHTS:
        raise ValueError(
            f"`int8_weights` must be one of {INT8_WEIGHTS} or None. Received: {requested!r}"
        )


def worst_drift(report: dict) -> float:
    """The largest `relative_drift` over the outputs of a `quantization_drift` report."""
    return max(entry["relative_drift"] for entry in report.values())


def pick(candidates: dict, bound: float = DRIFT_BOUND) -> str:
    """The weight type to keep, from `{type: {"relative_drift", "ms"}}`: the fastest of those
    whose drift is within `bound`; when none is, the one with the least drift."""
    within = [name for name, m in candidates.items() if m["relative_drift"] <= bound]
    if within:
        return min(within, key=lambda name: (candidates[name]["ms"], name))
    return min(candidates, key=lambda name: (candidates[name]["relative_drift"], name))


def time_session(session: "ort.InferenceSession", feeds: dict, repeats: int = 7) -> float:
    """Median milliseconds of `repeats` runs of `session` on `feeds` (after one warm-up)."""
    run_onnx(session, feeds)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run_onnx(session, feeds)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def largest_feeds(
    cases: Sequence[tuple[int, int, dict[str, np.ndarray], dict[str, np.ndarray]]],
) -> dict:
    """The feeds of the biggest parity case (most positions), the one timed."""
    return max(cases, key=lambda case: int(np.prod(case[0:2])))[2]


def quantization_entry(
    weights: str, chosen_by: str, candidates: dict[str, dict[str, Any]] | None = None
) -> dict:
    """The manifest's `quantization`: the weight type, how it was chosen, each measured
    candidate, the drift bound and the CPU flags."""
    return {
        "weights": weights,
        "chosen_by": chosen_by,
        "cpu_flags": cpu_flags(),
        "drift_bound": DRIFT_BOUND,
        "candidates": candidates or {},
    }
