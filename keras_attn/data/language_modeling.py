"""Next-token training pairs from token streams."""

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np


def lm_windows(
    documents_ids: Iterable[Sequence[int] | np.ndarray], sequence_length: int, pad_token_id: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Cuts each document's ids into `(inputs, targets)` windows for next-token prediction.

    Every document is split into windows of `sequence_length + 1` ids taken every
    `sequence_length` ids (inputs = window[:-1], targets = window[1:]); a document's last
    window is padded with `pad_token_id`, which the loss and metrics ignore. Windows never cross
    documents.

    Args:
        documents_ids: iterable of 1-D int sequences, one per document.
        sequence_length: int. Length of each input.
    Returns:
        `(inputs, targets)`, int32 arrays `(num_windows, sequence_length)`.
    """
    if not isinstance(sequence_length, int) or sequence_length < 1:
        raise ValueError(
            f"`sequence_length` must be a positive integer. Received: {sequence_length!r}"
        )
    windows: Any = []  # arrays, then stacked into one
    span = sequence_length + 1
    for ids in documents_ids:
        ids = np.asarray(ids, dtype=np.int32)
        for start in range(0, max(len(ids) - 1, 0), sequence_length):
            window = np.full(span, pad_token_id, dtype=np.int32)
            chunk = ids[start : start + span]
            window[: len(chunk)] = chunk
            windows.append(window)
    if not windows:
        raise ValueError("`documents_ids` holds no document with at least two tokens.")
    windows = np.stack(windows)
    return windows[:, :-1], windows[:, 1:]
