"""Layers quantized in Keras (`model.quantize("int4")`) as onnxruntime's `MatMulNBits`.

Keras stores an int4 `Dense` / `EinsumDense` kernel as a `(K, N)` matrix of values in
[-8, 7] (two to a byte along N), and either one scale per column (`w = q / scale`,
symmetric) or, by default, blocks of `block_size` rows per column with a scale and a zero
point each (`w = (q - zero) · scale`), `g_idx` naming each row's block. `MatMulNBits` holds
the same numbers laid out per column: values shifted to [0, 15] (two to a byte along K, low
nibble first), `scales (N, blocks)`, zero points shifted the same way (none: 8). The graph
then computes with exactly Keras's weights (float32 activations, accuracy level 1), and the
export's check holds it to Keras's logits.
"""

from dataclasses import dataclass

import keras
import numpy as np

# Blocks MatMulNBits takes: a power of two, at least 16.
MIN_BLOCK = 16
# The block a per-column scale is repeated over.
PER_COLUMN_BLOCK = 128


@dataclass(frozen=True)
class QuantizedKernel:
    """A `(k, n)` kernel in MatMulNBits' layout: `packed (n, blocks, block_size / 2)` uint8,
    `scales (n, blocks)` float32, `zero_points (n, ceil(blocks / 2))` uint8 or None."""

    packed: np.ndarray
    scales: np.ndarray
    zero_points: np.ndarray | None
    block_size: int
    k: int
    n: int


def is_int4(layer: keras.layers.Layer) -> bool:
    """Whether Keras quantized `layer` to int4."""
    return getattr(layer, "quantization_mode", None) == "int4"


def _block(layer: keras.layers.Layer) -> int | None:
    """Rows per block of an int4 layer's scales, or None: one scale a column."""
    block = getattr(layer, "_int4_block_size", None)
    return int(block) if block is not None and block != -1 else None


def unsupported(layer: keras.layers.Layer) -> str | None:
    """Why an int4 layer has no MatMulNBits form, or None."""
    if getattr(layer, "lora_enabled", False):
        return f"{layer.path}: int4 with LoRA adapters (merge them before quantizing)"
    block = _block(layer)
    if block is None:
        return None
    if block < MIN_BLOCK or block & (block - 1):
        return f"{layer.path}: int4 block size {block} is not a power of two of at least 16"
    rows = int(np.asarray(layer.g_idx).shape[0])
    if not np.array_equal(np.asarray(layer.g_idx).astype(np.int64), np.arange(rows) // block):
        return f"{layer.path}: int4 rows are grouped out of order (g_idx)"
    zero = np.asarray(layer.kernel_zero).astype(np.int64)
    if zero.min() < -8 or zero.max() > 7:
        return f"{layer.path}: int4 zero points outside [-8, 7]"
    return None


def _columns(layer: keras.layers.Layer) -> int:
    if hasattr(layer, "_int4_unpacked_column_size"):  # EinsumDense
        return int(layer._int4_unpacked_column_size)
    return int(layer._orig_output_dim)  # Dense


def _pack_along_last(values: np.ndarray) -> np.ndarray:
    """uint8 values in [0, 15], two to a byte along the last axis, low nibble first."""
    if values.shape[-1] % 2:
        values = np.concatenate([values, np.zeros((*values.shape[:-1], 1), np.uint8)], -1)
    return (values[..., 0::2] | (values[..., 1::2] << 4)).astype(np.uint8)


def int4_kernel(layer: keras.layers.Layer) -> QuantizedKernel:
    """An int4 `Dense` / `EinsumDense` kernel (`unsupported(layer)` None) in MatMulNBits'
    layout; its rows are the kernel's contracted axes, flattened as Keras flattens them."""
    n = _columns(layer)
    q = np.asarray(keras.quantizers.unpack_int4(layer._kernel, n, axis=-1), np.int64)
    k = q.shape[0]
    block = _block(layer)
    if block is None:  # one scale a column: w = q / scale
        block = max(MIN_BLOCK, min(PER_COLUMN_BLOCK, 1 << (k - 1).bit_length()))
        blocks = -(-k // block)
        column_scale = 1.0 / np.asarray(layer.kernel_scale, np.float32).reshape(n)
        scales = np.repeat(column_scale[:, None], blocks, axis=1).astype(np.float32)
        zero_points = None
    else:  # w = (q - zero) · scale, per block of rows
        blocks = -(-k // block)
        scales = np.asarray(layer.kernel_scale, np.float32).reshape(blocks, n).T.copy()
        zero = np.asarray(layer.kernel_zero).astype(np.int64).reshape(blocks, n).T + 8
        zero_points = _pack_along_last(zero.astype(np.uint8))
    shifted = np.full((n, blocks * block), 8, np.uint8)  # padding rows: weight 0
    shifted[:, :k] = (q + 8).T.astype(np.uint8)
    packed = _pack_along_last(shifted.reshape(n, blocks, block))
    return QuantizedKernel(packed, scales, zero_points, int(block), int(k), n)


def concatenate(kernels: list[QuantizedKernel]) -> QuantizedKernel:
    """Kernels side by side along N (q | k | v): the same K and block size each."""
    first = kernels[0]
    if any((q.k, q.block_size) != (first.k, first.block_size) for q in kernels):
        raise ValueError("int4 q, k and v kernels differ in their rows or block size")
    if any((q.zero_points is None) != (first.zero_points is None) for q in kernels):
        raise ValueError("int4 q, k and v kernels differ in having zero points")
    zero_points = None
    if first.zero_points is not None:
        zero_points = np.concatenate([q.zero_points for q in kernels])  # type: ignore[misc]
    return QuantizedKernel(
        np.concatenate([q.packed for q in kernels]), np.concatenate([q.scales for q in kernels]),
        zero_points, first.block_size, first.k, sum(q.n for q in kernels),
    )  # fmt: skip
