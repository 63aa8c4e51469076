"""Parity: the same padded inputs through Keras, the SavedModel and onnxruntime."""

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

DEFAULT_BATCH_SIZES = (1, 3)
DEFAULT_SEQUENCE_LENGTHS = (7, 16)


class ParityError(ValueError):
    """An exported artifact disagrees with the Keras model beyond the tolerance."""


def input_kind(name: str) -> str:
    """What an integer input holds, from its name: `"position"` (`mask_positions` too),
    `"mask"`, `"segment"`, `"token"`, or `"other"`. The parity sweep and the manifest's input
    ranges share it."""
    for kind in ("position", "mask", "segment", "token"):
        if kind in name:
            return kind
    return "other"


def default_range(name: str, max_token_id: int, sequence_length: int) -> tuple[int, int]:
    """Values an integer input takes in the sweep, by `input_kind`: segment ids are 0 or 1, a
    padding mask is 1 (its padded tail is 0), positions index the sequence, anything else is a
    token id in `[1, max_token_id)`."""
    return {
        "mask": (1, 2),
        "segment": (0, 2),
        "position": (0, sequence_length),
    }.get(input_kind(name), (1, max(2, max_token_id)))  # token ids, and anything else


def sample_inputs(
    specs: list[dict[str, Any]],
    batch_size: int,
    sequence_length: int,
    max_token_id: int,
    input_ranges: dict[str, tuple[int, int]] | None = None,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """Random inputs for `specs` (`[{"name", "dtype", "shape"}]`), integer ones padded with 0.

    Named axes (`batch`, `sequence`, ...) take `batch_size`, then `sequence_length`; fixed
    axes (e.g. the choices of a multiple-choice model) keep their size. Integer inputs draw
    from `input_ranges[name] = (low, high)` or `default_range`; along the last axis every row
    after the first loses a different number of trailing values to padding, so padded rows
    are always part of the check (positions are never padded: they index the sequence).
    """
    rng = np.random.default_rng(seed)
    input_ranges = input_ranges or {}
    feeds = {}
    for spec in specs:
        axes = spec.get("shape", ["batch", "sequence"])[1:]
        shape = (batch_size, *(d if isinstance(d, int) else sequence_length for d in axes))
        if np.issubdtype(np.dtype(spec["dtype"]), np.integer):
            low, high = input_ranges.get(
                spec["name"], default_range(spec["name"], max_token_id, sequence_length)
            )
            x = rng.integers(low, high, size=shape).astype(spec["dtype"])
            if "position" not in spec["name"]:
                for row in range(1, batch_size):
                    x[row, ..., max(1, shape[-1] - 2 * row) :] = 0
        else:
            x = rng.normal(size=shape).astype(spec["dtype"])
        feeds[spec["name"]] = x
    return feeds


def max_abs_diff(a: "ArrayLike", b: "ArrayLike") -> float:
    """Largest |a - b|; NaN if either holds a NaN (np.max propagates it)."""
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


def format_table(rows: list[dict[str, Any]], tolerance: float | dict[str, float]) -> str:
    """Plain-text table of parity rows (dicts with batch, seq, and one column per runtime)."""
    columns = [k for k in rows[0] if k not in ("batch", "seq", "output")]
    head = f"{'output':<12}{'batch':>6}{'seq':>6}" + "".join(f"{c:>22}" for c in columns)
    lines = [head, "-" * len(head)]
    for row in rows:
        cells = "".join(f"{row[c]:>22.3e}" for c in columns)
        lines.append(f"{row['output']:<12}{row['batch']:>6}{row['seq']:>6}{cells}")
    lines.append(f"max |difference| vs Keras; tolerance {tolerance}")
    return "\n".join(lines)


def check_tolerance(tolerance: float | dict[str, float]) -> float | dict[str, float]:
    """`tolerance` (a float or `{output name: float}`) checked: each finite and >= 0."""
    values = tolerance.values() if isinstance(tolerance, dict) else [tolerance]
    for value in values:
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not np.isfinite(value)
            or value < 0
        ):
            raise ValueError(
                f"`tolerance` must be a finite number >= 0 (or a dict of them). "
                f"Received: tolerance={tolerance!r}"
            )
    return tolerance


def check(rows: list[dict[str, Any]], tolerance: float | dict[str, float]) -> float:
    """The worst difference; raises `ParityError` with the table when a row exceeds the
    tolerance of its output (`tolerance`: a float, or `{output name: float}`) or is NaN (a
    NaN anywhere in an output never passes)."""

    def allowed(output: str) -> float:
        if isinstance(tolerance, dict):
            if output not in tolerance:
                raise ValueError(
                    f"`tolerance` has no entry for output {output!r}. Received: {tolerance}"
                )
            return tolerance[output]
        return tolerance

    def diffs(row: dict[str, Any]) -> list[float]:
        return [v for k, v in row.items() if k not in ("batch", "seq", "output")]

    worst = max(max(diffs(row)) for row in rows)
    if any(np.isnan(diffs(row)).any() for row in rows):
        worst = float("nan")
    # `not <=` so that NaN fails: NaN compares false with everything.
    if any(not max(diffs(row)) <= allowed(row["output"]) or np.isnan(diffs(row)).any()
           for row in rows):  # fmt: skip
        raise ParityError(
            f"exported model differs from Keras by up to {worst:.3e}, beyond tolerance "
            f"{tolerance}:\n" + format_table(rows, tolerance)
        )
    return worst
