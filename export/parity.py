"""Parity: the same padded inputs through Keras, the SavedModel and onnxruntime."""

import numpy as np

DEFAULT_BATCH_SIZES = (1, 3)
DEFAULT_SEQUENCE_LENGTHS = (7, 16)


class ParityError(ValueError):
    """An exported artifact disagrees with the Keras model beyond the tolerance."""


def sample_inputs(specs, batch_size, sequence_length, max_token_id, seed=0):
    """Random inputs for `specs` (`[{"name", "dtype"}]`), integer ones padded with 0.

    Integer inputs are ids in `[1, max_token_id)`; every row after the first loses a different
    number of trailing tokens to padding, so padded rows are always part of the check.
    """
    rng = np.random.default_rng(seed)
    feeds = {}
    for spec in specs:
        shape = (batch_size, sequence_length)
        if np.issubdtype(np.dtype(spec["dtype"]), np.integer):
            x = rng.integers(1, max(2, max_token_id), size=shape).astype(spec["dtype"])
            for row in range(1, batch_size):
                x[row, max(1, sequence_length - 2 * row) :] = 0
        else:
            x = rng.normal(size=shape).astype(spec["dtype"])
        feeds[spec["name"]] = x
    return feeds


def max_abs_diff(a, b):
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


def format_table(rows, tolerance):
    """Plain-text table of parity rows (dicts with batch, seq, and one column per runtime)."""
    columns = [k for k in rows[0] if k not in ("batch", "seq", "output")]
    head = f"{'output':<12}{'batch':>6}{'seq':>6}" + "".join(f"{c:>22}" for c in columns)
    lines = [head, "-" * len(head)]
    for row in rows:
        cells = "".join(f"{row[c]:>22.3e}" for c in columns)
        lines.append(f"{row['output']:<12}{row['batch']:>6}{row['seq']:>6}{cells}")
    lines.append(f"max |difference| vs Keras; tolerance {tolerance:g}")
    return "\n".join(lines)


def check(rows, tolerance):
    worst = max(v for row in rows for k, v in row.items() if k not in ("batch", "seq", "output"))
    if worst > tolerance:
        raise ParityError(
            f"exported model differs from Keras by {worst:.3e} > tolerance {tolerance:g}:\n"
            + format_table(rows, tolerance)
        )
    return worst
