"""Greedy decoding (NumPy only): over any `logits_fn(token_ids) -> logits`, and over an
exported decode graph with a key/value cache."""

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


def cached_greedy(step, spec, prompts, max_new_tokens, stop_token_ids=(), pad_id=0):
    """Greedy decoding over an exported decode graph (NumPy only; serving uses it too).

    `step(token_ids, cache, index) -> (last_logits, cache)`. Prompts of different lengths
    share a right-padded buffer: the shortest prompt is prefilled for every row, then each
    step writes one position for all rows (rows still inside their prompt keep the prompt's
    token). A row ends at its first stop token, which is included in its output.
    """
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("`prompts` must be a non-empty list of non-empty id lists.")
    if max_new_tokens == 0:
        return [[] for _ in prompts]
    lengths = np.array([len(p) for p in prompts])
    total = int(lengths.max()) + max_new_tokens
    if total > spec["max_length"]:
        raise ValueError(
            f"prompt length {int(lengths.max())} + max_new_tokens {max_new_tokens} exceeds the "
            f"model's maximum sequence length {spec['max_length']}"
        )
    buffer = np.full((len(prompts), total), pad_id, dtype=np.int32)
    for row, prompt in enumerate(prompts):
        buffer[row, : len(prompt)] = prompt
    shape = (len(prompts), spec["layers"], 2, spec["max_length"], spec["kv_heads"],
             spec["key_dim"])  # fmt: skip
    cache = np.zeros(shape, np.float32)
    start = int(lengths.min())
    stop = np.asarray(sorted(set(int(t) for t in stop_token_ids)), dtype=np.int64)
    done = np.zeros(len(prompts), bool)
    logits, cache = step(buffer[:, :start], cache, np.int32(0))
    for t in range(start, total):
        last = np.asarray(logits, np.float64)
        last[:, pad_id] = -np.inf
        chosen = np.where(done, pad_id, last.argmax(-1))
        generated = t >= lengths
        buffer[:, t] = np.where(generated, chosen, buffer[:, t])
        done |= generated & np.isin(chosen, stop)
        if done.all() or t == total - 1:
            break
        logits, cache = step(buffer[:, t : t + 1], cache, np.int32(t))
    new = []
    for row, n in enumerate(lengths):
        ids = buffer[row, n : n + max_new_tokens].tolist()
        cut = next((i for i, token in enumerate(ids) if token in set(stop.tolist())), None)
        new.append(ids if cut is None else ids[: cut + 1])
    return new
