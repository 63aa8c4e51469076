"""A causal LM's decode step written directly as onnxruntime operators (`decode_gqa.onnx`).

tf2onnx's `decode.onnx` spells each block's attention as dozens of Shape/Gather/Concat/
ScatterND nodes and copies the whole key/value cache in and out every step (~0.6–0.8 ms a
token on 2 CPU cores, 0.3x Keras's XLA loop). This graph is the same model laid out as
onnxruntime's own transformer operators, from the Keras weights:

    Gather(token) + Gather(position)
    per block: LayerNormalization, one MatMul+Add for q|k|v, `GroupQueryAttention`
               (com.microsoft) over a BNSH cache, MatMul+Add, FFN (MatMul, activation,
               MatMul), residuals — pre-norm or post-norm as the block is
    final LayerNormalization, last position, MatMul by Eᵀ (tied output projection)

Inputs: `token_ids (batch, new) int32`, `index () int32` (position of the first new token),
`past_key_N`/`past_value_N (batch, kv_heads, max_length, key_dim)` per block. Outputs:
`logits (batch, vocab)` of the last new token, `present_key_N`/`present_value_N`, the same
shape as the past ones. When past and present are bound to one buffer
(`keras_attn_serving.generation.BoundCache`), onnxruntime writes the new keys and values in
place, and no step copies the cache. Every row decodes the same positions, as `greedy_decode` runs.

`export_model` checks this graph's greedy output against Keras and records it in the
manifest; models it cannot express (see `supported`) keep `decode.onnx` only.
"""

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import keras
    import onnx
    from numpy.typing import ArrayLike

    from keras_attn.models.cached import CachedCausalLM

ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "swish", "silu")


def supported(lm: "CachedCausalLM") -> str | None:
    """`None` if `write_decode_graph` can express the model, else the reason."""
    if lm.position_embedding is None:
        return "the embedding is a TokenAndPositionEmbedding (one position layer is expressed)"
    for block in lm.decoder_blocks:
        attention = block.self_attention
        if not attention.score.is_scaled_dot:
            return f"{block.name}: score {attention.score.__class__.__name__} is not scaled dot"
        if getattr(block, "cross_attention", None) is not None:
            return f"{block.name} has cross-attention"
        if (attention.value_dim or attention.key_dim) != attention.key_dim:
            return f"{block.name}: value_dim differs from key_dim"
        if block.activation not in ACTIVATIONS:
            return f"{block.name}: activation {block.activation!r}"
        if attention.key_dim % 8:
            # onnxruntime's CPU GroupQueryAttention: "head_size must be a multiple of 8".
            return f"{block.name}: key_dim {attention.key_dim} is not a multiple of 8"
        if not attention.use_bias:
            return f"{block.name}: attention without biases"
    return None


def _weights(layer):
    return [np.asarray(w, np.float32) for w in layer.get_weights()]


class _Graph:
    nodes: list["onnx.NodeProto"]
    initializers: list["onnx.TensorProto"]
    count: int

    def __init__(self) -> None:
        self.nodes, self.initializers, self.count = [], [], 0

    def const(self, name: str, array: "ArrayLike") -> str:
        from onnx import numpy_helper

        self.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def op(
        self,
        op_type: str,
        inputs: list[str],
        outputs: int | list[str] = 1,
        domain: str = "",
        **attrs: Any,
    ) -> Any:
        from onnx import helper

        self.count += 1
        if isinstance(outputs, list):
            names = outputs
        else:
            names = [f"{op_type.lower()}_{self.count}_{i}" for i in range(outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, names, domain=domain, **attrs))
        return names[0] if len(names) == 1 else names

    def dense(self, x: str, kernel: "ArrayLike", bias: "ArrayLike", prefix: str) -> Any:
        y = self.op("MatMul", [x, self.const(f"{prefix}.kernel", kernel)])
        return self.op("Add", [y, self.const(f"{prefix}.bias", bias)])

    def layer_norm(self, x: str, layer: "keras.layers.Layer", prefix: str) -> Any:
        gamma, beta = _weights(layer)
        return self.op(
            "LayerNormalization",
            [x, self.const(f"{prefix}.gamma", gamma), self.const(f"{prefix}.beta", beta)],
            axis=-1, epsilon=float(layer.epsilon),
        )  # fmt: skip

    def activation(self, x: str, name: str) -> Any:
        if name == "relu":
            return self.op("Relu", [x])
        if name == "gelu":
            return self.op("Gelu", [x], domain="com.microsoft")  # exact, erf
        if name == "gelu_tanh":
            return self.op("FastGelu", [x], domain="com.microsoft")
        return self.op("Mul", [x, self.op("Sigmoid", [x])])  # swish / silu


def _attend(g, attention, h, n, prefix, hidden, seqlens, total):
    """Block `n`'s self-attention of `h` over its cache: one MatMul+Add for q|k|v, then
    `GroupQueryAttention` (which writes `present_*_n`), then W_O."""
    heads = attention.num_heads
    kv_heads = attention.num_key_value_heads or heads
    key_dim = attention.key_dim
    wq, bq, wk, bk, wv, bv, wo, bo = _weights(attention)
    kernel = np.concatenate([w.reshape(hidden, -1) for w in (wq, wk, wv)], axis=1)
    bias = np.concatenate([b.reshape(-1) for b in (bq, bk, bv)])
    sizes = np.array([heads * key_dim, kv_heads * key_dim, kv_heads * key_dim])
    qkv = g.dense(h, kernel, bias, f"{prefix}.qkv")
    q, k, v = g.op("Split", [qkv, g.const(f"{prefix}.sizes", sizes)], outputs=3, axis=-1)
    out = g.op(
        "GroupQueryAttention",
        [q, k, v, f"past_key_{n}", f"past_value_{n}", seqlens, total],
        outputs=[f"{prefix}.attention", f"present_key_{n}", f"present_value_{n}"],
        domain="com.microsoft", num_heads=heads, kv_num_heads=kv_heads,
        scale=float(attention.score.scale_for(key_dim)),
    )[0]  # fmt: skip
    return g.dense(out, wo.reshape(heads * key_dim, hidden), bo, f"{prefix}.output")


def _feed_forward(g, block, h, prefix):
    w1, b1, w2, b2 = _weights(block.feed_forward)
    h = g.activation(g.dense(h, w1, b1, f"{prefix}.ffn1"), block.activation)
    return g.dense(h, w2, b2, f"{prefix}.ffn2")


def write_decode_graph(
    lm: "CachedCausalLM", path: str | Path, max_length: int, opset: int = 17
) -> dict[str, Any]:
    """Writes the decode-step graph of a causal LM's cached call (`CausalLM`, or
    `keras_attn.models.cached.FunctionalCausalLM`) to `path`; returns the
    spec the manifest records (`layers`, `kv_heads`, `key_dim`, `max_length`, names)."""
    import onnx
    from onnx import TensorProto, helper

    reason = supported(lm)
    if reason is not None:
        raise ValueError(f"the decode graph cannot express this model: {reason}")
    # LayerNormalization needs opset 17; the graph needs onnxruntime (its contrib operators)
    # anyway, so an older export opset for model.onnx does not lower this one.
    opset = max(int(opset), 17)
    g = _Graph()
    embeddings = _weights(lm.token_embedding)[0]  # (vocab, d)
    vocab, hidden = embeddings.shape
    # `position_embedding` is not None: `supported(lm)` refused that above.
    table = np.asarray(
        lm.position_embedding(np.zeros((1, max_length, hidden), np.float32), start_index=0)  # type: ignore[misc]
    ).reshape(max_length, hidden)
    tokens = g.op("Gather", [g.const("token_embedding", embeddings), "token_ids"])
    shape = g.op("Shape", ["token_ids"])  # (batch, new)
    new = g.op("Gather", [shape, g.const("one", np.array(1))])
    one = g.const("one_i32", np.array(1, np.int32))
    end = g.op("Add", ["index", g.op("Cast", [new], to=TensorProto.INT32)])
    steps = g.op("Range", ["index", end, one])
    x = g.op("Add", [tokens, g.op("Gather", [g.const("position_table", table), steps])])
    # GroupQueryAttention: seqlens_k = total length - 1 for every row; total length.
    batch = g.op(
        "Slice", [shape, g.const("zero_1d", np.array([0])), g.const("one_1d", np.array([1]))]
    )
    last = g.op("Unsqueeze", [g.op("Sub", [end, one]), "zero_1d"])
    seqlens = g.op("Expand", [last, batch])

    inputs = [
        helper.make_tensor_value_info("token_ids", TensorProto.INT32, ["batch", "new"]),
        helper.make_tensor_value_info("index", TensorProto.INT32, []),
    ]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", vocab])]
    spec = {"layers": len(lm.decoder_blocks), "max_length": int(max_length)}
    for n, block in enumerate(lm.decoder_blocks):
        attention = block.self_attention
        kv_heads = attention.num_key_value_heads or attention.num_heads
        key_dim = attention.key_dim
        spec.update(kv_heads=kv_heads, key_dim=key_dim)
        cache_shape = ["batch", kv_heads, max_length, key_dim]
        for kind in ("key", "value"):
            inputs.append(
                helper.make_tensor_value_info(f"past_{kind}_{n}", TensorProto.FLOAT, cache_shape)
            )
            outputs.append(
                helper.make_tensor_value_info(f"present_{kind}_{n}", TensorProto.FLOAT, cache_shape)
            )
        p = f"block_{n}"
        sublayers: tuple[Callable[..., Any], Callable[..., Any]] = (
            (lambda h, n=n, p=p, a=attention: _attend(g, a, h, n, p, hidden, seqlens, end)),
            (lambda h, p=p, b=block: _feed_forward(g, b, h, p)),
        )
        norms = (block.self_attention_layer_norm, block.feed_forward_layer_norm)
        for sublayer, norm in zip(sublayers, norms, strict=True):
            if block.normalize_first:
                x = g.op("Add", [x, sublayer(g.layer_norm(x, norm, f"{p}.{norm.name}"))])
            else:
                x = g.layer_norm(g.op("Add", [x, sublayer(x)]), norm, f"{p}.{norm.name}")
    # Only the last new position's logits are returned: take it before the final norm.
    position = g.op("Sub", [new, g.const("one_i64", np.array(1))])
    x = g.op("Gather", [x, position], axis=1)  # (batch, d)
    if lm.final_norm is not None:
        x = g.layer_norm(x, lm.final_norm, "final_layer_norm")
    if lm.head is None:  # tied: the token embedding, transposed
        g.op("MatMul", [x, g.const("output_projection", embeddings.T.copy())], outputs=["logits"])
    else:
        kernel, *bias = _weights(lm.head)
        projected = g.op("MatMul", [x, g.const("output_projection", kernel)])
        if bias:
            g.op("Add", [projected, g.const("output_bias", bias[0])], outputs=["logits"])
        else:
            g.op("Identity", [projected], outputs=["logits"])

    graph = helper.make_graph(g.nodes, "decode_step", inputs, outputs, g.initializers)
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)],
        producer_name="keras_attn_export.decode_graph",
        ir_version=8,  # what opset 17 needs; newer onnx writes versions onnxruntime refuses
    )
    onnx.checker.check_model(model)
    spec["opset"] = opset
    onnx.save(model, str(path))
    return spec
