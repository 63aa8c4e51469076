"""Beam search over a Keras `Runner`: the server's NumPy implementation
(`keras_attn_serving.beam`, `transformers`' scoring) run on the model's cached step or, without
the cache, on the full prefix."""

from typing import Any

import numpy as np
from keras import ops
from keras_attn_serving.beam import (
    ban_ngrams,
    banned_ngram_ids,
    beam_ids,
    check_beam_arguments,
    length_normalized,
)

from keras_attn.decoding.runners import Runner, position, select_rows

__all__ = [
    "ban_ngrams",
    "banned_ngram_ids",
    "beam_search",
    "check_beam_arguments",
    "length_normalized",
]


def beam_search(
    runner: Runner,
    row: int,
    prompt: list[int],
    max_new_tokens: int,
    num_beams: int,
    length_penalty: float,
    stop: set[int],
    pad_token_id: int | None,
    use_cache: bool = True,
    early_stopping: bool | str = False,
    no_repeat_ngram_size: int = 0,
    forced_eos_token_id: int | None = None,
    forced_bos_token_id: int | None = None,
) -> list[int]:
    """The best hypothesis's new ids for prompt `row` (see `keras_attn_serving.beam.beam_ids`).
    `use_cache=False` recomputes the whole prefix every step (the reference)."""
    state = runner.initial_state([row], len(prompt) + max_new_tokens)

    def last(logits: Any) -> np.ndarray:
        return ops.convert_to_numpy(logits[:, -1])

    if use_cache:

        def step(ids: np.ndarray, state: Any, index: int) -> tuple[np.ndarray, Any]:
            logits, state = runner.compiled_step(ids, state, position(index))
            return last(logits), state

        return beam_ids(step, select_rows, state, prompt, max_new_tokens, num_beams,
                        length_penalty, stop, pad_token_id, early_stopping,
                        no_repeat_ngram_size, forced_eos_token_id,
                        forced_bos_token_id)  # fmt: skip

    def full_step(ids: np.ndarray, state: Any, index: int) -> tuple[np.ndarray, Any]:
        prefix, inner = state
        prefix = np.concatenate([prefix[:, :index], ids], axis=1)
        return last(runner.compiled_full(prefix, inner)), (prefix, inner)

    def select(state: Any, rows: Any) -> Any:
        prefix, inner = state
        return prefix[np.asarray(rows)], select_rows(inner, rows)

    start = (np.zeros((1, 0), "int32"), state)
    return beam_ids(full_step, select, start, prompt, max_new_tokens, num_beams,
                    length_penalty, stop, pad_token_id, early_stopping,
                    no_repeat_ngram_size, forced_eos_token_id,
                        forced_bos_token_id)  # fmt: skip
