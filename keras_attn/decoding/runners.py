"""Step functions over key/value caches, one per model family, for the decoding loops.

A runner holds a model and answers three questions: the empty decoding state for some rows,
`step(ids, state, index)` (logits of `ids` placed at `index`, and the new state: only the new
tokens go through the blocks, attending over the cached keys and values), and `full(ids,
state)` (the same logits recomputed from scratch: the uncached reference).
"""

import keras
import numpy as np
from keras import ops

from keras_attn.decoding.stack import CausalStack
from keras_attn.layers.transformer_decoder import TransformerDecoder


def compile_step(fn):
    """`fn` traced once per input shape pattern on TensorFlow (eager dispatch dominates small
    decoding steps); unchanged on other backends."""
    if keras.backend.backend() != "tensorflow":
        return fn
    import tensorflow as tf

    return tf.function(fn, reduce_retracing=True)


def compiled(model, key, build):
    """`build()` once per model and `key`: compiled decoding functions outlive one `generate`
    call, so repeated calls do not trace and compile again. Kept outside Keras's attribute
    tracking."""
    functions = model.__dict__.get("_keras_attn_compiled")
    if functions is None:
        functions = {}
        object.__setattr__(model, "_keras_attn_compiled", functions)
    if key not in functions:
        functions[key] = build()
    return functions[key]


def position(index):
    """Step index as a tensor on TensorFlow, so compiled steps do not retrace per position."""
    if keras.backend.backend() != "tensorflow":
        return index
    import tensorflow as tf

    return tf.constant(index, tf.int32)


def select_rows(state, rows):
    """The state of `rows` (beam reordering): every tensor gathered along the batch axis."""
    rows = np.asarray(rows, dtype="int32")
    return keras.tree.map_structure(lambda t: ops.take(t, rows, axis=0), state)


class _Runner:
    """Shared by the runners: `embed(ids, index)`, the decoder `blocks` and `logits(x)`."""

    def __init__(self, model, embed, blocks, logits, max_length, vocabulary_size=None):
        self.model = model
        self.vocabulary_size = vocabulary_size  # prompt ids must lie below it
        self.embed, self.blocks, self.logits = embed, blocks, logits
        # Longest sequence the model can decode: its learned position table (None: sinusoidal).
        self.max_length = max_length
        self.compiled_step = compiled(model, "step", lambda: compile_step(self.step))
        self.compiled_full = compiled(model, "full", lambda: compile_step(self.full))

    def empty_caches(self, rows, max_length):
        caches = []
        for block in self.blocks:
            attention = block.self_attention
            heads = attention.num_key_value_heads or attention.num_heads
            shape = (rows, 2, max_length, heads, attention.key_dim)
            caches.append(ops.zeros(shape, dtype=block.compute_dtype))
        return caches

    def _decode(self, token_ids, caches, index, cross_caches=None, **block_kwargs):
        x = self.embed(token_ids, index)
        new_caches = []
        for n, (block, cache) in enumerate(zip(self.blocks, caches, strict=True)):
            if cross_caches is not None:
                block_kwargs["cross_attention_cache"] = cross_caches[n]
            x, cache = block(
                x, self_attention_cache=cache, self_attention_cache_update_index=index,
                **block_kwargs,
            )  # fmt: skip
            new_caches.append(cache)
        return self.logits(x), new_caches


class CausalLMRunner(_Runner):
    """Cached decoding for a `CausalLM`, or for a functional model of our layers that follows
    the contract of `keras_attn.decoding.stack`. State: `{"caches": [one per block]}`."""

    def __init__(self, model):
        from keras_attn.models import CausalLM

        stack = compiled(
            model, "stack", lambda: CausalStack(model, not isinstance(model, CausalLM))
        )
        super().__init__(
            model, stack.embed, stack.blocks, stack.logits, stack.max_length,
            stack.token_embedding.vocabulary_size,
        )  # fmt: skip
        # What the ONNX decode-graph writer reads (`keras_attn_export.decode_graph`).
        self.token_embedding, self.positions = stack.token_embedding, stack.positions
        self.final_norm, self.head, self.mask_zero = stack.final_norm, stack.head, stack.mask_zero
        self.model_inputs = stack.model_inputs

    def initial_state(self, rows, max_length):
        return {"caches": self.empty_caches(len(rows), max_length)}

    def step(self, token_ids, state, index):
        logits, caches = self._decode(token_ids, state["caches"], index)
        return logits, {"caches": caches}

    def full(self, token_ids, state):
        return self.model(self.model_inputs(token_ids), training=False)


class Seq2SeqRunner(_Runner):
    """Cached decoding for a `Seq2Seq`: the sources are encoded once, at construction, and
    each block's cross-attention keys and values are projected once per decoding.

    State: `{"caches", "cross_caches", "source_mask", "source_ids"}`.
    """

    def __init__(self, model, source_ids):
        embedding = (
            "encoder_token_embedding"
            if model.target_vocabulary_size is None
            else "decoder_token_embedding"
        )
        token_embedding = model.get_layer(embedding)
        positions = model.get_layer("decoder_positions")
        names = [layer.name for layer in model.layers]
        final_norm = (
            model.get_layer("decoder_final_norm") if "decoder_final_norm" in names else None
        )
        blocks = [
            layer
            for layer in model.layers
            if isinstance(layer, TransformerDecoder) and layer.name.startswith("decoder_block")
        ]

        def embed(token_ids, index):
            x = token_embedding(token_ids)
            return x + positions(x, start_index=index)

        def logits(x):
            if final_norm is not None:
                x = final_norm(x)
            return ops.cast(token_embedding(x, reverse=True), "float32")

        super().__init__(
            model, embed, blocks, logits, getattr(positions, "sequence_length", None),
            token_embedding.vocabulary_size,
        )  # fmt: skip
        if not source_ids or any(len(s) == 0 for s in source_ids):
            raise ValueError("`source_ids` must be a non-empty list of non-empty id lists.")
        width = max(len(s) for s in source_ids)
        self.source_ids = np.zeros((len(source_ids), width), dtype="int32")
        for row, ids in enumerate(source_ids):
            self.source_ids[row, : len(ids)] = ids
        names = [layer.name for layer in model.layers]
        last = "encoder_final_norm" if "encoder_final_norm" in names else None
        if last is None:
            last = max(
                (n for n in names if n.startswith("encoder_block_")),
                key=lambda n: int(n.rsplit("_", 1)[1]),
            )
        encoder = compiled(
            model,
            "encoder",
            lambda: keras.Model(model.input["encoder_token_ids"], model.get_layer(last).output),
        )
        self.encoded = encoder(self.source_ids, training=False)

    def initial_state(self, rows, max_length):
        rows = np.asarray(rows, dtype="int32")
        encoded = ops.take(self.encoded, rows, axis=0)
        return {
            "caches": self.empty_caches(len(rows), max_length),
            "cross_caches": [
                block.cross_attention.key_value_cache(encoded) for block in self.blocks
            ],
            "source_mask": ops.convert_to_tensor(self.source_ids[rows] != 0),
            "source_ids": ops.convert_to_tensor(self.source_ids[rows]),
        }

    def step(self, token_ids, state, index):
        logits, caches = self._decode(
            token_ids,
            state["caches"],
            index,
            cross_caches=state["cross_caches"],
            encoder_padding_mask=state["source_mask"],
        )
        return logits, {**state, "caches": caches}

    def full(self, token_ids, state):
        inputs = {
            "encoder_token_ids": state["source_ids"],
            "decoder_token_ids": ops.convert_to_tensor(token_ids),
        }
        return self.model(inputs, training=False)
