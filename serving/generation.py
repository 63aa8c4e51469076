"""Greedy decoding over any `logits_fn(token_ids) -> logits` (NumPy only)."""

import numpy as np


def greedy(
    logits_fn,
    prompts,
    max_new_tokens,
    stop_token_ids=(),
    pad_id=0,
    max_length=None,
):
    """Extends each prompt with its most likely next token, one step at a time.

    Prompts of different lengths share a right-padded batch: with causal attention a
    position never sees the padding after it, so each row reads its logits at its own last
    position. The padding id is never generated (it would read as padding on the next step).

    Args:
        logits_fn: maps int32 ids `(batch, length)` to logits `(batch, length, vocab)`.
        prompts: list of non-empty lists of ids.
        max_new_tokens: int. Steps to run.
        stop_token_ids: ids that end a row (included in its output).
        max_length: optional int. Longest sequence the model accepts.
    Returns:
        list of lists: the new ids of each prompt.
    """
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("`prompts` must be a non-empty list of non-empty id lists.")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"`max_new_tokens` must be >= 0. Received: {max_new_tokens!r}")
    lengths = np.array([len(p) for p in prompts])
    total = int(lengths.max()) + max_new_tokens
    if max_length is not None and total > max_length:
        raise ValueError(
            f"prompt length {int(lengths.max())} + max_new_tokens {max_new_tokens} exceeds the "
            f"model's maximum sequence length {max_length}"
        )
    batch = len(prompts)
    buffer = np.full((batch, total), pad_id, dtype=np.int32)
    for row, prompt in enumerate(prompts):
        buffer[row, : len(prompt)] = prompt
    done = np.zeros(batch, bool)
    new = [[] for _ in prompts]
    stop = set(int(t) for t in stop_token_ids)
    for _ in range(max_new_tokens):
        logits = np.asarray(logits_fn(buffer[:, : int(lengths.max())]))
        last = logits[np.arange(batch), lengths - 1].astype(np.float64)
        last[:, pad_id] = -np.inf
        next_ids = last.argmax(-1)
        for row in np.flatnonzero(~done):
            token = int(next_ids[row])
            buffer[row, lengths[row]] = token
            lengths[row] += 1
            new[row].append(token)
            done[row] = token in stop
        if done.all():
            break
    return new
