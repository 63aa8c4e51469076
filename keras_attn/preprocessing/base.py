"""Base of the TensorFlow-op preprocessing layers (tokenizers, packers, masking)."""

import inspect
from typing import Any

import keras
import tensorflow as tf

from keras_attn.types import Tensor


class PreprocessingLayer(keras.layers.Layer):
    """A layer whose `call` runs TensorFlow ops on int or string tensors.

    On a symbolic Keras input it is an ordinary layer (functional models, TF backend); on
    anything else (`tf.data` tensors, NumPy, lists) it runs its TensorFlow ops directly, so
    `dataset.map(layer)` works under every Keras backend.
    """

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("dtype", "int32")
        super().__init__(**kwargs)
        self.built = True  # no weights: nothing to build, and export can track it as is

    def __call__(self, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        if any(isinstance(x, keras.KerasTensor) for x in tf.nest.flatten(inputs)):
            return super().__call__(inputs, *args, **kwargs)
        return self.call(inputs, *args, **_accepted(self.call, kwargs))


@tf.autograph.experimental.do_not_convert
def _accepted(call, kwargs):
    """The `kwargs` that `call` declares. A functional model runs its layers with Keras's call
    context (`training`, `mask`), which `keras.layers.Layer.__call__` passes only to a `call`
    that takes it; so do we, on the direct path."""
    parameters = inspect.signature(call).parameters
    if any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        return kwargs
    return {key: value for key, value in kwargs.items() if key in parameters}


def to_ragged(
    ids: list[Any] | Tensor | tf.RaggedTensor, name: str = "inputs"
) -> tuple[tf.RaggedTensor, bool]:
    """Int ids (list, NumPy, dense or ragged; rank 1 or 2) -> `(ragged (batch, None), was_1d)`."""
    if not isinstance(ids, tf.RaggedTensor):
        ids = tf.ragged.constant(ids) if isinstance(ids, list) else tf.convert_to_tensor(ids)
    if ids.dtype not in (tf.int32, tf.int64):
        raise ValueError(f"`{name}` must hold integer ids. Received: dtype={ids.dtype.name}")
    if ids.shape.rank == 1:
        ids = tf.RaggedTensor.from_tensor(ids[tf.newaxis])
        return tf.cast(ids, tf.int32), True
    if ids.shape.rank != 2:
        raise ValueError(f"`{name}` must have rank 1 or 2. Received: shape={ids.shape}")
    if not isinstance(ids, tf.RaggedTensor):
        ids = tf.RaggedTensor.from_tensor(ids)
    return tf.cast(ids, tf.int32), False
