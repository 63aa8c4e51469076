"""Beam search as `transformers` runs it, and the n-gram rule every search may apply (NumPy
only: Keras-side `generate` and the server run this one implementation over their steps).

Each step extends every live beam by every token and ranks the `2 * num_beams` best
candidates by summed log-probability. A candidate that ends in a stop id and ranks among the
first `num_beams` is set aside as a finished hypothesis, scored `sum / length**length_penalty`
(`length` counts the new ids, the stop id included); the best `num_beams` candidates that did
not stop are the next live beams. At `max_new_tokens` the best `num_beams` candidates finish
as they are. The best finished hypothesis wins.
"""

from collections.abc import Callable, Collection, Sequence
from typing import Any

import numpy as np
from keras_attn_serving.sampling import force_ends, log_softmax

# `step(token_ids (rows, n), state, index) -> (last logits (rows, vocab), state)` and
# `select(state, rows) -> state` (the state of the beams that go on, in their new order).
Step = Callable[[np.ndarray, Any, int], tuple[Any, Any]]
Select = Callable[[Any, Sequence[int]], Any]

EARLY_STOPPING = (True, False, "never")


def length_normalized(score: float, length: int, alpha: float) -> float:
    """A hypothesis's score: summed log-probability over `length ** alpha`."""
    return float(score) / float(length) ** alpha


def banned_ngram_ids(sequence: Sequence[int], size: int) -> set[int]:
    """Ids that would repeat an n-gram of `size` already in `sequence` (prompt included),
    `transformers`' `no_repeat_ngram_size`."""
    if size <= 0 or len(sequence) + 1 < size:
        return set()
    prefix = tuple(sequence[len(sequence) + 1 - size :])
    return {
        int(sequence[i + size - 1])
        for i in range(len(sequence) - size + 1)
        if tuple(sequence[i : i + size - 1]) == prefix
    }


def ban_ngrams(log_probs: np.ndarray, sequences: Sequence[Sequence[int]], size: int) -> None:
    """Sets, in place, each row's ids that would repeat an n-gram to `-inf`."""
    for row, sequence in enumerate(sequences):
        banned = banned_ngram_ids(sequence, size)
        if banned:
            log_probs[row, sorted(banned)] = -np.inf


def check_beam_arguments(num_beams: int, early_stopping: bool | str, size: int) -> None:
    if not isinstance(num_beams, int) or isinstance(num_beams, bool) or num_beams <= 0:
        raise ValueError(f"`num_beams` must be a positive int. Received: num_beams={num_beams!r}")
    if not isinstance(early_stopping, (bool, str)) or early_stopping not in EARLY_STOPPING:
        raise ValueError(
            "`early_stopping` must be True, False or 'never'. "
            f"Received: early_stopping={early_stopping!r}"
        )
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ValueError(
            "`no_repeat_ngram_size` must be a non-negative int. "
            f"Received: no_repeat_ngram_size={size!r}"
        )


def _log_probs(logits: Any, pad_token_id: int | None) -> np.ndarray:
    last = np.array(logits, dtype="float64")
    if pad_token_id is not None:
        last[:, pad_token_id] = -np.inf  # padding is never generated
    return log_softmax(last)


def beam_ids(
    step: Step,
    select: Select,
    state: Any,
    prompt: Sequence[int],
    max_new_tokens: int,
    num_beams: int,
    length_penalty: float = 1.0,
    stop: Collection[int] = (),
    pad_token_id: int | None = None,
    early_stopping: bool | str = False,
    no_repeat_ngram_size: int = 0,
    forced_eos_token_id: int | None = None,
    forced_bos_token_id: int | None = None,
) -> list[int]:
    """Beam search for one prompt (see the module) from the decoding `state` of one row;
    returns the best hypothesis's new ids, without its stop id.

    `early_stopping`: `True` ends when `num_beams` hypotheses have finished; `False` ends when
    the best live beam, scored at its current length, cannot beat the worst of `num_beams`
    finished ones; `"never"` scores it at `max_new_tokens` instead (with `length_penalty >
    0`). With one beam this is greedy decoding. `forced_eos_token_id`: the only id the
    last step (the `max_new_tokens`-th id) may choose, as `transformers` forces it;
    `forced_bos_token_id`: the only first id after a one-id prompt (`sampling.force_ends`).
    """
    prompt = [int(t) for t in prompt]
    logits, state = step(np.asarray([prompt], dtype="int32"), state, 0)
    beams: list[list[int]] = [[]]
    scores = np.zeros(1)
    finished: list[tuple[float, list[int]]] = []  # (normalized score, new ids with stop)
    keep = max(2, 1 + len(stop)) * num_beams
    for n in range(max_new_tokens):
        full = early_stopping is True and len(finished) >= num_beams
        log_probs = _log_probs(logits, pad_token_id)
        if no_repeat_ngram_size:
            ban_ngrams(log_probs, [[*prompt, *b] for b in beams], no_repeat_ngram_size)
        last = n == max_new_tokens - 1
        log_probs = force_ends(log_probs, n, len(prompt), max_new_tokens,
                               forced_bos_token_id, forced_eos_token_id)  # fmt: skip
        candidates = (scores[:, None] + log_probs).ravel()
        vocab = log_probs.shape[-1]
        order = np.argsort(-candidates, kind="stable")[:keep]
        live: list[list[int]] = []
        sources: list[int] = []
        live_scores: list[float] = []
        for rank, flat in enumerate(order):
            if not np.isfinite(candidates[flat]):
                break
            beam, token = divmod(int(flat), vocab)
            sequence = [*beams[beam], token]
            if token in stop or last:
                if rank < num_beams and not full:
                    score = length_normalized(candidates[flat], n + 1, length_penalty)
                    finished.append((score, sequence))
            elif len(live) < num_beams:
                live.append(sequence)
                sources.append(beam)
                live_scores.append(candidates[flat])
        finished = sorted(finished, key=lambda item: -item[0])[:num_beams]
        beams, scores = live, np.asarray(live_scores)
        if last or not beams or _done(finished, scores, n + 1, max_new_tokens, num_beams,
                                      length_penalty, early_stopping):  # fmt: skip
            break
        state = select(state, sources)
        ids = np.asarray([[b[-1]] for b in beams], dtype="int32")
        logits, state = step(ids, state, len(prompt) + n)
    if not finished:  # every candidate was impossible (all -inf)
        return []
    best = finished[0][1]
    return best[:-1] if best and best[-1] in stop else best


def _done(finished, scores, generated, max_new_tokens, num_beams, alpha, early_stopping):
    """Whether no live beam can still enter the `num_beams` best finished hypotheses."""
    if len(finished) < num_beams:
        return False
    if early_stopping is True:
        return True
    length = max_new_tokens if early_stopping == "never" and alpha > 0 else generated
    return length_normalized(scores[0], length, alpha) <= finished[-1][0]
