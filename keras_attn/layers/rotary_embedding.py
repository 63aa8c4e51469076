"""Rotary position embedding (RoPE, Su et al.): positions as rotations of query/key pairs."""

import math
from typing import Any

import keras
import numpy as np
from keras import ops

from keras_attn.types import Shape, Tensor

# Hugging Face's rotary scaling types we compute, each with the keys it needs.
ROPE_TYPES: dict[str, tuple[str, ...]] = {
    "default": (),
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
}


def check_rope_scaling(rope_scaling: dict[str, Any] | None) -> dict[str, Any] | None:
    """`rope_scaling` in Hugging Face's form, validated: None, `{"rope_type": "linear",
    "factor": f}` or `{"rope_type": "llama3", "factor", "low_freq_factor",
    "high_freq_factor", "original_max_position_embeddings"}` (`"type"` read as `"rope_type"`)."""
    if rope_scaling is None:
        return None
    if not isinstance(rope_scaling, dict):
        raise ValueError(
            f"`rope_scaling` must be a dict or None. Received: rope_scaling={rope_scaling!r}"
        )
    kind = rope_scaling.get("rope_type", rope_scaling.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise ValueError(
            f"`rope_scaling` type must be one of {list(ROPE_TYPES)}. Received: rope_type={kind!r} "
            f"in rope_scaling={rope_scaling!r}"
        )
    for name in ROPE_TYPES[kind]:
        value = rope_scaling.get(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(
                f"`rope_scaling` ({kind}) needs a positive `{name}`. "
                f"Received: rope_scaling={rope_scaling!r}"
            )
    if kind == "llama3" and not rope_scaling["high_freq_factor"] > rope_scaling["low_freq_factor"]:
        raise ValueError(
            "`rope_scaling` needs high_freq_factor > low_freq_factor. "
            f"Received: rope_scaling={rope_scaling!r}"
        )
    return {**{k: v for k, v in rope_scaling.items() if k != "type"}, "rope_type": kind}


def inverse_frequencies(
    dim: int, max_wavelength: float, rope_scaling: dict[str, Any] | None = None
) -> np.ndarray:
    """Pair `i`'s angle per position, `max_wavelength^(-2i/dim)` (float64, `(dim/2,)`), with
    Hugging Face's `linear` or `llama3` frequency scaling applied."""
    inv_freq = 1.0 / max_wavelength ** (np.arange(0, dim, 2, dtype="float64") / dim)
    scaling = check_rope_scaling(rope_scaling) or {"rope_type": "default"}
    if scaling["rope_type"] == "linear":
        return inv_freq / scaling["factor"]
    if scaling["rope_type"] == "llama3":
        # Llama 3.1: long wavelengths slowed by `factor`, short ones kept, a smooth ramp between.
        factor, low, high = (scaling[k] for k in ("factor", "low_freq_factor", "high_freq_factor"))
        old_length = scaling["original_max_position_embeddings"]
        wavelength = 2 * math.pi / inv_freq
        smooth = (old_length / wavelength - low) / (high - low)
        scaled = np.where(wavelength > old_length / low, inv_freq / factor, inv_freq)
        between = (wavelength >= old_length / high) & (wavelength <= old_length / low)
        ramp = (1 - smooth) * inv_freq / factor + smooth * inv_freq
        return np.where(between, ramp, scaled)
    return inv_freq


def rotate(x: Tensor, inv_freq: np.ndarray, positions: Tensor, sequence_axis: int) -> Tensor:
    """`x` rotated pairwise by `positions · inv_freq`: `x · cos + rotate_half(x) · sin`.

    `positions` is `(T,)` (shared by the batch) or `(batch, T)` (per row, e.g. left padding);
    `x` has its positions on `sequence_axis` and the features, paired `(x[i], x[i + d/2])`,
    last."""
    rank, dim = len(x.shape), x.shape[-1]
    frequencies = ops.convert_to_tensor(inv_freq.astype("float32"))
    angles = ops.expand_dims(ops.cast(positions, "float32"), -1) * frequencies  # (.., T, d/2)
    angles = ops.concatenate([angles, angles], axis=-1)  # (.., T, d)
    cos, sin = ops.cos(angles), ops.sin(angles)
    if len(positions.shape) == 2:  # (batch, T, d): a unit axis for each axis between
        for axis in range(1, rank - 1):
            if axis != sequence_axis:
                cos, sin = ops.expand_dims(cos, axis), ops.expand_dims(sin, axis)
    else:
        shape = [1] * rank
        shape[sequence_axis], shape[-1] = -1, dim
        cos, sin = ops.reshape(cos, shape), ops.reshape(sin, shape)
    cos, sin = ops.cast(cos, x.dtype), ops.cast(sin, x.dtype)
    half = dim // 2
    rotated = ops.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


@keras.saving.register_keras_serializable(package="keras_attn")
class RotaryEmbedding(keras.layers.Layer):
    """Rotates feature pairs of queries or keys by an angle proportional to their position.

    Features are paired as `(x[i], x[i + d/2])` (the "rotate half" layout of GPT-NeoX,
    Hugging Face's Llama and keras-hub), pair `i` turning by `position · max_wavelength^(-2i/d)
    / scaling_factor`. Then `rope(q, m) · rope(k, n)` depends only on `q`, `k` and `m - n`:
    attention sees relative positions.

    Args:
        max_wavelength: float. Longest wavelength (Hugging Face's `rope_theta`). Defaults to
            `10000`.
        scaling_factor: float. Divides positions (linear position interpolation). Defaults to 1.
        sequence_axis: int. Axis of the positions. Defaults to `1`.
        rope_scaling: optional dict in Hugging Face's `rope_scaling` form: `{"rope_type":
            "linear", "factor": f}` or Llama 3.1's `{"rope_type": "llama3", "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192}`.
    Call arguments:
        inputs: `(batch, seq_len, ..., dim)` with an even `dim` on the last axis, e.g. the
            per-head queries `(batch, seq_len, heads, head_dim)`.
        start_index: position of the first step (for cached decoding).
        position_ids: optional int `(batch, seq_len)`: each token's own position (left-padded
            rows count from their first real token); replaces `start_index`.
    Returns:
        a tensor of the input's shape.
    Example:
        >>> q = keras.random.normal((2, 5, 4, 8))
        >>> tuple(RotaryEmbedding(max_wavelength=500000)(q, start_index=3).shape)
        (2, 5, 4, 8)
    """

    def __init__(
        self,
        max_wavelength: float = 10000,
        scaling_factor: float = 1.0,
        sequence_axis: int = 1,
        rope_scaling: dict[str, Any] | None = None,
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
        self.rope_scaling = check_rope_scaling(rope_scaling)
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

    def call(
        self, inputs: Tensor, start_index: int | Tensor = 0, position_ids: Tensor | None = None
    ) -> Tensor:
        axis = self.sequence_axis % len(inputs.shape)
        if position_ids is None:
            length = ops.shape(inputs)[axis]
            positions = ops.arange(length, dtype="float32") + ops.cast(start_index, "float32")
        else:
            if len(position_ids.shape) != 2 or axis == 0:
                raise ValueError(
                    "`position_ids` must be (batch, seq_len), with the sequence axis after the "
                    f"batch axis. Received: position_ids.shape={tuple(position_ids.shape)}, "
                    f"sequence_axis={self.sequence_axis}"
                )
            positions = position_ids
        inv_freq = inverse_frequencies(inputs.shape[-1], self.max_wavelength, self.rope_scaling)
        return rotate(inputs, inv_freq / self.scaling_factor, positions, axis)

    def compute_output_shape(self, inputs_shape: Shape) -> Shape:
        return inputs_shape

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "max_wavelength": self.max_wavelength,
            "scaling_factor": self.scaling_factor,
            "sequence_axis": self.sequence_axis,
            "rope_scaling": self.rope_scaling,
        }
