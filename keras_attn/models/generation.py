"""Greedy generation for `build_causal_lm` models, with a key/value cache per decoder block."""

import keras
import numpy as np
from keras import ops

from keras_attn.layers.transformer_decoder import TransformerDecoder


class CachedCausalLM:
    """Runs a `build_causal_lm` model one new token at a time over key/value caches.

    Each call processes only the new tokens: their keys and values are appended to each
    block's cache and they attend over the cache, instead of recomputing the whole prefix.

    Args:
        model: a model made by `keras_attn.models.build_causal_lm`.
    """

    def __init__(self, model):
        self.model = model
        self.token_embedding = model.get_layer("token_embedding")
        self.position_embedding = model.get_layer("position_embedding")
        self.blocks = [layer for layer in model.layers if isinstance(layer, TransformerDecoder)]
        names = [layer.name for layer in model.layers]
        self.final_norm = (
            model.get_layer("final_layer_norm") if "final_layer_norm" in names else None
        )
        if not self.blocks:
            raise ValueError(
                "`model` has no TransformerDecoder blocks: build it with build_causal_lm"
            )
        self._compiled_step = _compile(self.step)

    def empty_caches(self, batch_size, max_length):
        caches = []
        for block in self.blocks:
            attention = block.self_attention
            heads = attention.num_key_value_heads or attention.num_heads
            shape = (batch_size, 2, max_length, heads, attention.key_dim)
            caches.append(ops.zeros(shape, dtype=block.compute_dtype))
        return caches

    def step(self, token_ids, caches, index):
        """Logits `(batch, T, vocab)` of `token_ids` placed at `index`, and the new caches."""
        x = self.token_embedding(token_ids)
        x = x + self.position_embedding(x, start_index=index)
        new_caches = []
        for block, cache in zip(self.blocks, caches, strict=True):
            x, cache = block(x, self_attention_cache=cache, self_attention_cache_update_index=index)
            new_caches.append(cache)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return ops.cast(self.token_embedding(x, reverse=True), "float32"), new_caches


def _compile(fn):
    """`fn` traced once per input shape pattern on TensorFlow (eager dispatch dominates small
    decoding steps); unchanged on other backends, where callers may `jax.jit` themselves."""
    if keras.backend.backend() != "tensorflow":
        return fn
    import tensorflow as tf

    return tf.function(fn, reduce_retracing=True)


def _position(index):
    """Step index as a tensor on TensorFlow, so compiled steps do not retrace per position."""
    if keras.backend.backend() != "tensorflow":
        return index
    import tensorflow as tf

    return tf.constant(index, tf.int32)


def greedy_generate(model, prompts, max_new_tokens, pad_id=0, use_cache=True):
    """Greedy continuation of id prompts of any lengths; returns the new ids of each.

    Prompts share one right-padded buffer. Step `t` decodes position `t` for every row: rows
    whose prompt is longer than `t` keep their prompt token, the others take the argmax of the
    previous position's logits. With `use_cache`, each step feeds only position `t` through
    the blocks' key/value caches; without, it recomputes the whole prefix (the reference).

    Args:
        model: a `build_causal_lm` model.
        prompts: list of non-empty lists of ids.
        max_new_tokens: int. New tokens per prompt.
        use_cache: bool. Defaults to `True`.
    Returns:
        list of lists of ids.
    """
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("`prompts` must be a non-empty list of non-empty id lists.")
    lengths = np.array([len(p) for p in prompts])
    width = int(lengths.max()) + max_new_tokens
    buffer = np.full((len(prompts), width), pad_id, dtype="int32")
    for row, prompt in enumerate(prompts):
        buffer[row, : len(prompt)] = prompt
    start = int(lengths.min())
    runner = CachedCausalLM(model) if use_cache else None
    forward = _compile(lambda ids: model(ids, training=False))
    if use_cache:
        caches = runner.empty_caches(len(prompts), width)
        logits, caches = runner._compiled_step(buffer[:, :start], caches, _position(0))
    else:
        logits = forward(buffer[:, :start])
    for t in range(start, width):
        last = keras.ops.convert_to_numpy(logits[:, -1]).astype("float64")
        last[:, pad_id] = -np.inf
        buffer[:, t] = np.where(t < lengths, buffer[:, t], last.argmax(-1))
        if t == width - 1:
            break
        if use_cache:
            logits, caches = runner._compiled_step(buffer[:, t : t + 1], caches, _position(t))
        else:
            logits = forward(buffer[:, : t + 1])
    return [buffer[row, n : n + max_new_tokens].tolist() for row, n in enumerate(lengths)]
