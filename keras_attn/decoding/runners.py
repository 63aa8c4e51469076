"""What the decoding loops need from a model, as callables: `keras_attn.decoding` knows no
model family. A model builds its `Runner` from its own cached call (`CausalLM.runner()`,
`Seq2Seq.runner(source_ids)`); a new family needs no change here.

A runner answers three questions: the empty decoding state for some rows
(`initial_state(rows, max_length)`), `step(ids, state, index)` (logits of `ids` placed at
`index`, and the new state: only the new tokens go through the blocks, attending over the
cached keys and values), and `full(ids, state)` (the same logits recomputed from scratch: the
uncached reference).
"""

from collections.abc import Callable, Sequence
from typing import Any

import keras
import numpy as np
from keras import ops

from keras_attn.types import Tensor


def compile_step(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` traced once per input shape pattern on TensorFlow (eager dispatch dominates small
    decoding steps); unchanged on other backends."""
    if keras.backend.backend() != "tensorflow":
        return fn
    import tensorflow as tf

    return tf.function(fn, reduce_retracing=True)


def compiled(owner: Any, key: str, build: Callable[[], Any]) -> Any:
    """`build()` once per `owner` (a model) and `key`: compiled decoding functions outlive one
    `decode` call, so repeated calls do not trace and compile again. Kept outside Keras's
    attribute tracking."""
    functions = owner.__dict__.get("_keras_attn_compiled")
    if functions is None:
        functions = {}
        object.__setattr__(owner, "_keras_attn_compiled", functions)
    if key not in functions:
        functions[key] = build()
    return functions[key]


def position(index: int) -> int | Tensor:
    """Step index as a tensor on TensorFlow, so compiled steps do not retrace per position."""
    if keras.backend.backend() != "tensorflow":
        return index
    import tensorflow as tf

    return tf.constant(index, tf.int32)


def select_rows(state: Any, rows: Sequence[int] | np.ndarray) -> Any:
    """The state of `rows` (beam reordering): every tensor gathered along the batch axis."""
    rows = np.asarray(rows, dtype="int32")
    return keras.tree.map_structure(lambda t: ops.take(t, rows, axis=0), state)


class Runner:
    """A model's decoding callables.

    Args:
        owner: the model; compiled `step` and `full` are kept on it under `key`, so they
            must read per-call data from `state` only.
        step: `(token_ids, state, index) -> (logits, state)`, the cached call.
        full: `(token_ids, state) -> logits`, the uncached reference.
        initial_state: `(rows, max_length) -> state` for the prompts numbered `rows`.
        vocabulary_size: optional int; prompt ids must lie below it.
        max_length: optional int; the longest sequence the model decodes.
        key: name of the compiled functions on `owner`.
    """

    def __init__(
        self,
        owner: Any,
        step: Callable,
        full: Callable,
        initial_state: Callable,
        vocabulary_size: int | None = None,
        max_length: int | None = None,
        key: str = "",
    ) -> None:
        self.model = owner
        self.step, self.full, self.initial_state = step, full, initial_state
        self.vocabulary_size = vocabulary_size
        self.max_length = max_length
        self.compiled_step = compiled(owner, f"{key}step", lambda: compile_step(step))
        self.compiled_full = compiled(owner, f"{key}full", lambda: compile_step(full))
