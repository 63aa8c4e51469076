"""Cached decoding exported: one ONNX graph that takes and returns the key/value cache.

`decode.onnx` maps `token_ids (batch, new)`, `cache (batch, layers, 2, max_length, kv_heads,
key_dim)` and `index ()` to `logits (batch, vocab)` of the last new token and
`updated_cache` (same shape as `cache`).
The same graph prefills a prompt (`index` 0, all prompt tokens) and decodes one token at a
time (`index` t), so onnxruntime generation never recomputes the prefix.
"""

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import keras

from keras_attn.layers.tracing import onnx_tracing
from keras_attn.models.cached import CachedCausalLM, cached_causal_lm

if TYPE_CHECKING:
    import tensorflow as tf


def cache_spec(lm: CachedCausalLM, max_length: int) -> dict[str, int]:
    """`{"layers", "kv_heads", "key_dim", "max_length"}` of a causal LM's cache."""
    attention = lm.decoder_blocks[0].self_attention
    return {
        "layers": len(lm.decoder_blocks),
        "kv_heads": attention.num_key_value_heads or attention.num_heads,
        "key_dim": attention.key_dim,
        "max_length": int(max_length),
    }


def decode_function(
    lm: CachedCausalLM, spec: dict[str, int]
) -> tuple[Callable[..., Any], list["tf.TensorSpec"]]:
    """A `tf.function` of (token ids, stacked cache, index) running `lm.call_with_cache`."""
    import tensorflow as tf

    signature = [
        tf.TensorSpec([None, None], tf.int32, name="token_ids"),
        tf.TensorSpec(
            [None, spec["layers"], 2, spec["max_length"], spec["kv_heads"], spec["key_dim"]],
            tf.float32,
            name="cache",
        ),
        tf.TensorSpec([], tf.int32, name="index"),
    ]

    @tf.function(input_signature=signature)
    def decode(
        token_ids: "tf.Tensor", cache: "tf.Tensor", index: "tf.Tensor"
    ) -> dict[str, "tf.Tensor"]:
        caches = [cache[:, n] for n in range(spec["layers"])]
        with onnx_tracing():  # tf2onnx converts ScatterND, not XlaDynamicUpdateSlice
            logits, caches = lm.call_with_cache(token_ids, caches, index)
        return {"logits": logits[:, -1], "updated_cache": tf.stack(caches, axis=1)}

    return decode, signature


def write_decode_onnx(model: keras.Model, path: Path, max_length: int, opset: int = 17) -> dict:
    """Writes the decode graph of a `CausalLM` to `path`; returns its cache spec (for the
    manifest)."""
    import tf2onnx

    lm = cached_causal_lm(model)
    spec = cache_spec(lm, max_length)
    decode, signature = decode_function(lm, spec)
    proto, _ = tf2onnx.convert.from_function(decode, input_signature=signature, opset=opset)
    with open(path, "wb") as f:
        f.write(proto.SerializeToString())
    return spec
