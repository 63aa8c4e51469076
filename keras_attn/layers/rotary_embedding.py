"""Rotary position embedding (RoPE, Su et al.): positions as rotations of query/key pairs."""

import math
from typing import Any

import keras
from keras import ops

from keras_attn.types import Shape, Tensor


@keras.saving.register_keras_serializable(package="keras_attn")
class RotaryEmbedding(keras.layers.Layer):
    """Rotates feature pairs of queries or keys by an angle proportional to their position.

    Features are paired as `(x[i], x[i + d/2])` (the "rotate half" layout of GPT-NeoX and
    keras-hub), pair `i` turning by `position · max_wavelength^(-2i/d) / scaling_factor`. Then
    `rope(q, m) · rope(k, n)` depends only on `q`, `k` and `m - n`: attention sees relative
    positions.

    Args:
        max_wavelength: float. Longest wavelength. Defaults to `10000`.
        scaling_factor: float. Divides positions (linear position interpolation). Defaults to 1.
        sequence_axis: int. Axis of the positions. Defaults to `1`.
    Call arguments:
        inputs: `(batch, seq_len, ..., dim)` with an even `dim` on the last axis, e.g. the
            per-head queries `(batch, seq_len, heads, head_dim)`.
        start_index: position of the first step (for cached decoding).
    Returns:
        a tensor of the input's shape.
    """

    def __init__(
        self,
        max_wavelength: float = 10000,
        scaling_factor: float = 1.0,
        sequence_axis: int = 1,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if not max_wavelength > 1:
            raise ValueError(
                "`max_wavelength` must be greater than 1. "
                f"Received: max_wavelength={max_wavelength}"
            )
        if not scaling_factor > 0:
            raise ValueError(
                f"`scaling_factor` must be positive. Received: scaling_factor={scaling_factor}"
            )
        self.max_wavelength = max_wavelength
        self.scaling_factor = scaling_factor
        self.sequence_axis = sequence_axis
        self.supports_masking = True

    def build(self, inputs_shape: Shape) -> None:
        rank = len(inputs_shape)
        axis = self.sequence_axis % rank if rank else 0
        if rank < 2 or axis == rank - 1:
            raise ValueError(
                "`inputs` needs a sequence axis and a feature axis. Received: "
                f"inputs.shape={tuple(inputs_shape)}, sequence_axis={self.sequence_axis}"
            )
        if inputs_shape[-1] is None or inputs_shape[-1] % 2:
            raise ValueError(
                "The last axis of `inputs` must have an even, known size. "
                f"Received: inputs.shape={tuple(inputs_shape)}"
            )

    def call(self, inputs: Tensor, start_index: int | Tensor = 0) -> Tensor:
        rank = len(inputs.shape)
        axis = self.sequence_axis % rank
        dim = inputs.shape[-1]
        half = dim // 2
        length = ops.shape(inputs)[axis]
        positions = ops.arange(length, dtype="float32") + ops.cast(start_index, "float32")
        positions = positions / self.scaling_factor
        inv_freq = ops.exp(
            -math.log(self.max_wavelength) * ops.arange(0, dim, 2, dtype="float32") / dim
        )
        angles = ops.expand_dims(positions, -1) * inv_freq  # (T, d/2)
        angles = ops.concatenate([angles, angles], axis=-1)  # (T, d)
        shape = [1] * rank
        shape[axis], shape[-1] = -1, dim
        cos = ops.cast(ops.reshape(ops.cos(angles), shape), self.compute_dtype)
        sin = ops.cast(ops.reshape(ops.sin(angles), shape), self.compute_dtype)
        x1, x2 = inputs[..., :half], inputs[..., half:]
        rotated = ops.concatenate([-x2, x1], axis=-1)
        return inputs * cos + rotated * sin

    def compute_output_shape(self, inputs_shape: Shape) -> Shape:
        return inputs_shape

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "max_wavelength": self.max_wavelength,
            "scaling_factor": self.scaling_factor,
            "sequence_axis": self.sequence_axis,
        }
