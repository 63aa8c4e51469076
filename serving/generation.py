"""Greedy decoding (NumPy only), one loop for every way of computing the next logits: an
exported decode graph with a key/value cache (`decode.onnx`), or any full-prefix
`logits_fn(token_ids) -> logits` (recomputing the prefix every step)."""

import numpy as np


def greedy_decode(step, state, prompts, max_new_tokens, stop_token_ids=(), pad_id=0,
                  max_length=None):  # fmt: skip
    """Extends each prompt with its most likely next token, one position at a time.

    `step(token_ids, state, index) -> (last_logits (batch, vocab), state)` runs new tokens
    placed at `index`. Prompts of different lengths share a right-padded buffer: the
    shortest prompt's length is prefilled for every row, then each step writes one position
    for all rows (rows still inside their prompt keep the prompt's token). The padding id is
    never generated. A row ends at its first stop token, which is included in its output.

    Returns:
        list of lists: the new ids of each prompt.
    """
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("`prompts` must be a non-empty list of non-empty id lists.")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"`max_new_tokens` must be >= 0. Received: {max_new_tokens!r}")
    if max_new_tokens == 0:
        return [[] for _ in prompts]
    lengths = np.array([len(p) for p in prompts])
    total = int(lengths.max()) + max_new_tokens
    if max_length is not None and total > max_length:
        raise ValueError(
            f"prompt length {int(lengths.max())} + max_new_tokens {max_new_tokens} exceeds the "
            f"model's maximum sequence length {max_length}"
        )
    buffer = np.full((len(prompts), total), pad_id, dtype=np.int32)
    for row, prompt in enumerate(prompts):
        buffer[row, : len(prompt)] = prompt
    stop = set(int(t) for t in stop_token_ids)
    stop_ids = np.asarray(sorted(stop), dtype=np.int64)
    done = np.zeros(len(prompts), bool)
    start = int(lengths.min())
    logits, state = step(buffer[:, :start], state, 0)
    for t in range(start, total):
        last = np.asarray(logits, np.float64)
        last[:, pad_id] = -np.inf
        chosen = np.where(done, pad_id, last.argmax(-1))
        generated = t >= lengths
        buffer[:, t] = np.where(generated, chosen, buffer[:, t])
        done |= generated & np.isin(chosen, stop_ids)
        if done.all() or t == total - 1:
            break
        logits, state = step(buffer[:, t : t + 1], state, t)
    new = []
    for row, n in enumerate(lengths):
        ids = buffer[row, n : n + max_new_tokens].tolist()
        cut = next((i for i, token in enumerate(ids) if token in stop), None)
        new.append(ids if cut is None else ids[: cut + 1])
    return new


def greedy(logits_fn, prompts, max_new_tokens, stop_token_ids=(), pad_id=0, max_length=None):
    """`greedy_decode` over a full-prefix `logits_fn` (int32 ids `(batch, length)` → logits
    `(batch, length, vocab)`): the state is the prefix, recomputed every step."""

    def step(token_ids, prefix, index):
        prefix = np.concatenate([prefix[:, :index], token_ids], axis=1)
        return np.asarray(logits_fn(prefix))[:, -1], prefix

    empty = np.zeros((len(prompts), 0), np.int32)
    return greedy_decode(step, empty, prompts, max_new_tokens, stop_token_ids, pad_id,
                         max_length)  # fmt: skip


def session_step(session):
    """The step function of an exported `decode.onnx` onnxruntime session."""

    def step(token_ids, cache, index):
        feeds = {"token_ids": np.asarray(token_ids, np.int32), "cache": cache,
                 "index": np.asarray(index, np.int32)}  # fmt: skip
        return session.run(["logits", "updated_cache"], feeds)

    return step


def cached_greedy(step, spec, prompts, max_new_tokens, stop_token_ids=(), pad_id=0):
    """`greedy_decode` over an exported decode graph's `step` (see `session_step`), starting
    from an empty cache shaped by `spec` (the manifest's `decoding` entry)."""
    shape = (len(prompts), spec["layers"], 2, spec["max_length"], spec["kv_heads"],
             spec["key_dim"])  # fmt: skip
    return greedy_decode(step, np.zeros(shape, np.float32), prompts, max_new_tokens,
                         stop_token_ids, pad_id, spec["max_length"])  # fmt: skip
