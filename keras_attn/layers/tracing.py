"""Where and how attention is traced: for ONNX export (`onnx_tracing`, `write_cache`) and on
which device (`on_tensorflow_cpu`, which picks the per-(batch, head) path)."""

from typing import TYPE_CHECKING

import keras
from keras import ops

from keras_attn.layers.masks import mask_value, per_row, row_positions
from keras_attn.types import Tensor

if TYPE_CHECKING:  # it imports this module
    from keras_attn.layers.multi_head_attention import MultiHeadAttention

_TRACING = {"onnx": False}


class onnx_tracing:
    """Context in which attention traces into graphs shaped for tf2onnx and onnxruntime.

    Same values, other operators:
    - cached attention writes new keys/values with a scatter (`ScatterND`) instead of a
      dynamic slice update (TensorFlow's `XlaDynamicUpdateSlice` has no tf2onnx converter);
    - the fused scaled-dot path projects with plain matrix products and attends as
      `softmax(q kᵀ + bias) v` over `(B, H, T, d)` heads, with the masks as one additive bias.
      tf2onnx writes that as a handful of MatMul/Transpose/Softmax nodes (the einsums write
      dozens of shape nodes), and `keras_attn_export.optimize.fuse` rewrites it into onnxruntime's
      `MultiHeadAttention` operator.
    """

    def __enter__(self):
        self._previous = _TRACING["onnx"]
        _TRACING["onnx"] = True
        return self

    def __exit__(self, *exc):
        _TRACING["onnx"] = self._previous


def write_cache(cache: Tensor, start: int | Tensor, new: Tensor) -> Tensor:
    """`cache (B, S, ...)` with `new (B, T, ...)` written at positions `start .. start+T-1`;
    `start` is one int (or scalar) for every row, or a `(B,)` tensor, one per row."""
    if not _TRACING["onnx"] and not per_row(start):
        return ops.slice_update(cache, [0, start] + [0] * (len(cache.shape) - 2), new)
    batch, length = ops.shape(new)[0], ops.shape(new)[1]
    rows = ops.broadcast_to(ops.expand_dims(ops.arange(batch, dtype="int32"), 1), (batch, length))
    columns = ops.broadcast_to(row_positions(length, start), (batch, length))
    indices = ops.stack([ops.reshape(rows, (-1,)), ops.reshape(columns, (-1,))], axis=1)
    updates = ops.reshape(new, (-1, *new.shape[2:]))
    return ops.scatter_update(cache, indices, updates)


def on_tensorflow() -> bool:
    return keras.backend.backend() == "tensorflow"


def _tensorflow_gpus():
    """The GPUs TensorFlow places ops on by default (none on a CPU-only machine)."""
    import tensorflow as tf

    return tf.config.list_logical_devices("GPU")


def on_tensorflow_cpu(tensor: Tensor | None = None) -> bool:
    """TensorFlow placing this computation on a CPU: `tensor`'s device when it has one, else
    no GPU visible to TensorFlow (where ops go by default)."""
    if not on_tensorflow():
        return False
    device = getattr(tensor, "device", "") or ""
    if device:
        return "GPU" not in device.upper()
    return not _tensorflow_gpus()


def is_onnx_tracing() -> bool:
    """Whether attention is being traced for ONNX (inside `onnx_tracing`)."""
    return _TRACING["onnx"]


def attend_for_onnx(
    layer: "MultiHeadAttention",
    query: Tensor,
    key: Tensor,
    value: Tensor,
    merged: Tensor | None,
    padding: tuple[Tensor | None, Tensor | None] | None = None,
) -> Tensor:
    """The fused path of `layer` (a `MultiHeadAttention`) as `onnx_tracing` writes it:
    `(B, T, H·d)` projections by matmul, `softmax(q kᵀ + bias) v` over `(B, H, T, d)` heads,
    the output projection by matmul.

    `merged` is every mask as one bool `(B|1, T|1, S)`, added as one `(B, 1, T, S)` bias.
    `padding`, when the masks are padding masks alone, is `(query_mask, key_mask)` (each
    `(B, T|S)` or `None`): the keys' mask is then added as a `(B, 1, 1, S)` bias row,
    `(mask - 1) · |mask_value|`, which `keras_attn_export.optimize.fuse` turns into
    onnxruntime's 2-D mask index (no `(B, T, S)` tensor is built in each layer)."""
    heads, depth = layer.num_heads, layer.key_dim

    def project(dense: keras.layers.EinsumDense, x: Tensor) -> Tensor:
        kernel = ops.reshape(dense.kernel, (x.shape[-1], -1))
        y = ops.matmul(x, ops.cast(kernel, x.dtype))
        if dense.bias is None:
            return y
        return y + ops.cast(ops.reshape(dense.bias, (-1,)), x.dtype)

    def split(
        x: Tensor, perm: tuple[int, int, int, int]
    ) -> Tensor:  # (B, T, H·d) -> (B, H, T, d), or (B, H, d, T) for keys
        shape = ops.shape(x)
        return ops.transpose(ops.reshape(x, (shape[0], shape[1], heads, depth)), perm)

    q = project(layer.query_dense, query)
    q = ops.multiply(q, ops.cast(layer.score.scale_for(depth), q.dtype))
    k = project(layer.key_dense, key)
    v = project(layer.value_dense, value)
    scores = ops.matmul(split(q, (0, 2, 1, 3)), split(k, (0, 2, 3, 1)))  # (B, H, T, S)
    query_mask, key_mask = padding if padding is not None else (None, None)
    visible = None  # (B, T, 1): rows with a visible key
    if key_mask is not None:
        keep = ops.cast(key_mask, scores.dtype)
        bias = (keep - 1.0) * ops.cast(-mask_value(scores.dtype), scores.dtype)
        scores = scores + ops.expand_dims(ops.expand_dims(bias, 1), 1)
        if query_mask is not key_mask:  # one mask for both: a visible query sees itself
            visible = ops.any(ops.cast(key_mask, "bool"), axis=-1, keepdims=True)  # (B, 1)
            visible = ops.expand_dims(visible, 1)
    if query_mask is not None:
        rows = ops.expand_dims(ops.cast(query_mask, "bool"), -1)
        visible = rows if visible is None else ops.logical_and(visible, rows)
    if merged is not None and padding is None:  # (B|1, T|1, S), as `combined_mask` returns it
        # One additive bias (B|1, 1, T, S): onnxruntime's attention takes it as it is.
        full = (ops.shape(merged)[0], ops.shape(query)[1], ops.shape(key)[1])
        merged = ops.broadcast_to(merged, full)
        bias = ops.where(merged, 0.0, mask_value(scores.dtype))
        scores = scores + ops.expand_dims(ops.cast(bias, scores.dtype), 1)
        visible = ops.any(merged, axis=-1, keepdims=True)
    weights = ops.softmax(scores, axis=-1)
    out = ops.transpose(ops.matmul(weights, split(v, (0, 2, 1, 3))), (0, 2, 1, 3))
    shape = ops.shape(out)
    out = ops.reshape(out, (shape[0], shape[1], heads * depth))
    if visible is not None:  # rows with no visible key give zeros, as on every path
        out = out * ops.cast(visible, out.dtype)
    return project(layer.output_dense, out)
