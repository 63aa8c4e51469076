"""Score functions: how much a query matches each key.

A score maps queries `(..., T, d_q)` and keys `(..., S, d_k)` to scores `(..., T, S)`; the
leading axes (batch, or batch and heads) are carried through. Attention turns the scores into
weights with a softmax. Select one by name (`score="scaled_dot"`) or pass an instance of a
`Score` subclass to plug in your own.
"""

import math
from typing import Any

import keras
from keras import ops

from keras_attn.layers.initializers import fresh
from keras_attn.types import Initializer, Shape, Tensor


@keras.saving.register_keras_serializable(package="keras_attn")
class Score(keras.layers.Layer):
    """Base class of score functions: `call(query, key) -> scores (..., T, S)`.

    Subclass it and implement `call` (and `build` if the score has weights) to plug a new score
    into `Attention`, `MultiHeadAttention` and the Transformer blocks.
    """

    #: True when the score is `q·k/√d_k`, which attention may hand to a fused kernel.
    is_scaled_dot = False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # Inputs may carry Keras masks; attention applies them to the scores, not the score.
        self.supports_masking = True

    def build(self, query_shape: Shape, key_shape: Shape) -> None:
        pass  # scores without weights need no build

    def compute_mask(self, query: Tensor, key: Tensor, mask: Tensor | None = None) -> Tensor | None:
        return None

    def call(self, query: Tensor, key: Tensor) -> Tensor:
        raise NotImplementedError(f"{type(self).__name__} must implement `call(query, key)`.")

    def compute_output_shape(self, query_shape: Shape, key_shape: Shape) -> Shape:
        return (*query_shape[:-1], key_shape[-2])


def _check_same_depth(layer, query_shape, key_shape):
    if query_shape[-1] is not None and key_shape[-1] is not None:
        if query_shape[-1] != key_shape[-1]:
            raise ValueError(
                f"`{layer.name}` needs queries and keys of the same depth. Received: "
                f"query.shape={tuple(query_shape)}, key.shape={tuple(key_shape)}. "
                "Use a `bilinear` or `additive` score, or project them to one size."
            )


@keras.saving.register_keras_serializable(package="keras_attn")
class DotScore(Score):
    """Dot-product score `q·k` (Luong's "dot").

    Example:
        >>> ops.convert_to_numpy(DotScore()(ops.ones((1, 1, 2)), ops.ones((1, 3, 2)))).tolist()
        [[[2.0, 2.0, 2.0]]]
    """

    def build(self, query_shape: Shape, key_shape: Shape) -> None:
        _check_same_depth(self, query_shape, key_shape)

    def call(self, query: Tensor, key: Tensor) -> Tensor:
        return ops.matmul(query, ops.swapaxes(key, -1, -2))


@keras.saving.register_keras_serializable(package="keras_attn")
class ScaledDotScore(Score):
    """Scaled dot-product score `q·k / √d_k` (Vaswani et al.).

    Args:
        scale: optional float replacing `1/√d_k`.
    """

    is_scaled_dot = True

    def __init__(self, scale: float | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if scale is not None and not scale > 0:
            raise ValueError(f"`scale` must be a positive number. Received: scale={scale}")
        self.scale = scale

    def build(self, query_shape: Shape, key_shape: Shape) -> None:
        _check_same_depth(self, query_shape, key_shape)

    def scale_for(self, depth: int) -> float:
        """The factor applied to `q·k` for keys of depth `depth`."""
        return self.scale if self.scale is not None else 1.0 / math.sqrt(depth)

    def call(self, query: Tensor, key: Tensor) -> Tensor:
        scale = ops.cast(self.scale_for(query.shape[-1]), query.dtype)
        return ops.matmul(ops.multiply(query, scale), ops.swapaxes(key, -1, -2))

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "scale": self.scale}


@keras.saving.register_keras_serializable(package="keras_attn")
class BilinearScore(Score):
    """Bilinear score `qᵀ W k` with a learned `W (d_q, d_k)` (Luong's "general").

    Args:
        kernel_initializer: initializer of `W`. Defaults to `"glorot_uniform"`.
    """

    def __init__(self, kernel_initializer: Initializer = "glorot_uniform", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)

    def build(self, query_shape: Shape, key_shape: Shape) -> None:
        self.kernel = self.add_weight(
            name="kernel",
            shape=(query_shape[-1], key_shape[-1]),
            initializer=self.kernel_initializer,
        )

    def call(self, query: Tensor, key: Tensor) -> Tensor:
        return ops.matmul(ops.matmul(query, self.kernel), ops.swapaxes(key, -1, -2))

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
        }


@keras.saving.register_keras_serializable(package="keras_attn")
class AdditiveScore(Score):
    """Additive (MLP) score `vᵀ tanh(W_q q + W_k k + b)` (Bahdanau et al.).

    Memory grows as `T·S·units`: it is meant for the short sequences of RNN-style models.

    Args:
        units: int. Width of the hidden layer. Defaults to the key depth.
        use_bias: bool. Add `b` inside the tanh. Defaults to `True`.
        kernel_initializer: initializer of `W_q`, `W_k` and `v`.
    """

    def __init__(
        self,
        units: int | None = None,
        use_bias: bool = True,
        kernel_initializer: Initializer = "glorot_uniform",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if units is not None and (not isinstance(units, int) or units <= 0):
            raise ValueError(f"`units` must be a positive integer. Received: units={units}")
        self.units = units
        self.use_bias = use_bias
        self.kernel_initializer = keras.initializers.get(kernel_initializer)

    def build(self, query_shape: Shape, key_shape: Shape) -> None:
        units = self.units or key_shape[-1]
        init = self.kernel_initializer
        self.query_kernel = self.add_weight(
            name="query_kernel", shape=(query_shape[-1], units), initializer=fresh(init)
        )
        self.key_kernel = self.add_weight(
            name="key_kernel", shape=(key_shape[-1], units), initializer=fresh(init)
        )
        self.bias = (
            self.add_weight(name="bias", shape=(units,), initializer="zeros")
            if self.use_bias
            else None
        )
        self.score_kernel = self.add_weight(
            name="score_kernel", shape=(units,), initializer=fresh(init)
        )

    def call(self, query: Tensor, key: Tensor) -> Tensor:
        q = ops.expand_dims(ops.matmul(query, self.query_kernel), -2)  # (..., T, 1, u)
        k = ops.expand_dims(ops.matmul(key, self.key_kernel), -3)  # (..., 1, S, u)
        hidden = q + k
        if self.bias is not None:
            hidden = hidden + self.bias
        return ops.tensordot(ops.tanh(hidden), self.score_kernel, axes=1)  # (..., T, S)

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "units": self.units,
            "use_bias": self.use_bias,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
        }


SCORES = {
    "dot": DotScore,
    "scaled_dot": ScaledDotScore,
    "bilinear": BilinearScore,
    "additive": AdditiveScore,
}


def get_score(identifier: str | dict[str, Any] | Score, **kwargs: Any) -> Score:
    """Returns a `Score` layer from a name, a `Score` instance, or a serialized config.

    Args:
        identifier: one of `"dot"`, `"scaled_dot"`, `"bilinear"`, `"additive"`, a `Score`
            instance (returned as is), or the dict `keras.saving.serialize_keras_object` made.
        **kwargs: passed to the constructor when `identifier` is a name (e.g. `dtype`, `name`).
    """
    if isinstance(identifier, Score):
        return identifier
    if isinstance(identifier, str):
        if identifier not in SCORES:
            raise ValueError(
                f"`score` must be one of {sorted(SCORES)} or a `Score` instance. "
                f"Received: score={identifier!r}"
            )
        return SCORES[identifier](**kwargs)
    if isinstance(identifier, dict):
        score = keras.saving.deserialize_keras_object(identifier)
        if isinstance(score, Score):
            return score
    raise ValueError(
        f"`score` must be one of {sorted(SCORES)} or a `Score` instance. "
        f"Received: score={identifier!r}"
    )


def serialize_score(identifier: str | dict[str, Any] | Score, score: Score) -> str | dict[str, Any]:
    """Config value for a score argument: the name if one was given, else the serialized layer."""
    if isinstance(identifier, str):
        return identifier
    return keras.saving.serialize_keras_object(score)
