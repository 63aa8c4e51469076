"""A causal LM's decode step written directly as onnxruntime operators (`decode_gqa.onnx`).

tf2onnx's `decode.onnx` spells each block's attention as dozens of Shape/Gather/Concat/
ScatterND nodes and copies the whole key/value cache in and out every step (~0.6–0.8 ms a
token on 2 CPU cores, 0.3x Keras's XLA loop). This graph is the same model laid out as
onnxruntime's own transformer operators, from the Keras weights:

    Gather(token) + Gather(position)            (rotary models: Gather(token) alone)
    per block: LayerNormalization (or SimplifiedLayerNormalization: RMSNorm), one
               MatMul+Add for q|k|v, `GroupQueryAttention` (com.microsoft) over a BNSH
               cache — rotating q and k itself from cos/sin tables for rotary models —,
               MatMul+Add, FFN (MatMul, activation, MatMul; gated: act(x·W_g) ⊙ x·W_1),
               residuals — pre-norm or post-norm as the block is
    final norm, last position, MatMul by Eᵀ (tied) or by the untied output matrix

Inputs: `token_ids (batch, new) int32`, `index (1,) or (batch,) int32` (position of the first
new token: the same for every row, or one per row for rows at different lengths; graphs written
before iteration-level batching take a scalar),
`past_key_N`/`past_value_N (batch, kv_heads, max_length, key_dim)` per block. Outputs:
`logits (batch, vocab)` of the last new token, `present_key_N`/`present_value_N`, the same
shape as the past ones. When past and present are bound to one buffer
(`keras_attn_serving.generation.BoundCache`), onnxruntime writes the new keys and values in
place, and no step copies the cache. `decode_ids` decodes every row at the same positions; the
server's iteration-level batching (`keras_attn_serving.batched_generation`) gives each row its
own.

`export_model` checks this graph's greedy output against Keras and records it in the
manifest; models it cannot express (see `supported`) keep `decode.onnx` only.
"""

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from keras_attn_export.graph_builder import Graph, kernel_bias, layer_weights
from keras_attn_export.keras_int4 import QuantizedKernel, concatenate, is_int4, unsupported

from keras_attn.layers.rotary_embedding import inverse_frequencies

if TYPE_CHECKING:
    from keras_attn_export.weight_only import WeightOnly

    from keras_attn.models.cached import CachedCausalLM

ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "swish", "silu")


def _rotary(lm: "CachedCausalLM") -> tuple[float, Any] | None:
    """`(rope_max_wavelength, rope_scaling)` shared by every block, or None (no rotary)."""
    settings = {
        (b.self_attention.rope_max_wavelength, repr(b.self_attention.rope_scaling))
        for b in lm.decoder_blocks
    }
    wavelength, _ = next(iter(settings))
    if wavelength is None:
        return None
    return wavelength, lm.decoder_blocks[0].self_attention.rope_scaling


def supported(lm: "CachedCausalLM") -> str | None:
    """`None` if `write_decode_graph` can express the model, else the reason."""
    settings = {b.self_attention.rope_max_wavelength is None for b in lm.decoder_blocks}
    rope = {repr((b.self_attention.rope_max_wavelength, b.self_attention.rope_scaling))
            for b in lm.decoder_blocks}  # fmt: skip
    if len(settings) > 1 or len(rope) > 1:
        return "the blocks differ in their rotary settings"
    rotary = settings == {False}
    parts = [*lm.decoder_blocks, lm.token_embedding, *([lm.head] if lm.head is not None else [])]
    layers = [layer for part in parts for layer in part._flatten_layers()]
    quantized = [
        la.path for la in layers if getattr(la, "quantization_mode", None) and not is_int4(la)
    ]
    if quantized:
        return f"layers quantized in Keras ({quantized[0]}, …): their int8 math is decode.onnx's"
    for reason in (unsupported(layer) for layer in layers if is_int4(layer)):
        if reason is not None:
            return reason
    if lm.position_embedding is None and not rotary:
        return "the embedding is a TokenAndPositionEmbedding (one position layer is expressed)"
    if lm.position_embedding is not None and rotary:
        return "both a position layer and rotary attention"
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
        if rotary and attention.key_dim % 16:
            # onnxruntime's GroupQueryAttention rotates only heads whose size is a multiple of 16.
            return f"{block.name}: rotary key_dim {attention.key_dim} is not a multiple of 16"
        if block.normalization not in ("layer_norm", "rms_norm"):
            return f"{block.name}: normalization {block.normalization!r}"
    return None


# Past this many bytes of weights a graph keeps them in a file beside it (ONNX external data):
# a protobuf holds at most 2 GiB, and writing each tensor as it is made keeps no copy of the
# weights, where a graph holding them peaked at 4x their bytes more (SmolLM2-135M's shape:
# +2.2 GB against +0.24 GB, `write_decode_graph` alone).
EXTERNAL_DATA_BYTES = 64 << 20


def _attend(g, attention, h, n, prefix, hidden, seqlens, total, rotary):
    """Block `n`'s self-attention of `h` over its cache: one MatMul+Add for q|k|v, then
    `GroupQueryAttention` (which writes `present_*_n`, and rotates q and k by the `rotary`
    cos/sin tables when given), then W_O."""
    heads = attention.num_heads
    kv_heads = attention.num_key_value_heads or heads
    key_dim = attention.key_dim
    sizes = np.array([heads * key_dim, kv_heads * key_dim, kv_heads * key_dim])
    parts = [
        kernel_bias(dense, int(width))
        for dense, width in zip(
            (attention.query_dense, attention.key_dense, attention.value_dense), sizes,
            strict=True,
        )
    ]  # fmt: skip
    kernels = [w for w, _ in parts]
    if any(isinstance(w, QuantizedKernel) for w in kernels):
        kernel = concatenate(kernels)
    else:
        kernel = np.concatenate(kernels, axis=1)
    bias = np.concatenate([b for _, b in parts])
    qkv = g.dense(h, kernel, bias, f"{prefix}.qkv")
    q, k, v = g.op("Split", [qkv, g.const(f"{prefix}.sizes", sizes)], outputs=3, axis=-1)
    inputs = [q, k, v, f"past_key_{n}", f"past_value_{n}", seqlens, total]
    extra = {}
    if rotary is not None:
        inputs += list(rotary)
        extra = {"do_rotary": 1, "rotary_interleaved": 0}
    out = g.op(
        "GroupQueryAttention",
        inputs,
        outputs=[f"{prefix}.attention", f"present_key_{n}", f"present_value_{n}"],
        domain="com.microsoft", num_heads=heads, kv_num_heads=kv_heads,
        scale=float(attention.score.scale_for(key_dim)), **extra,
    )[0]  # fmt: skip
    wo, bo = kernel_bias(attention.output_dense, hidden)
    return g.dense(out, wo, bo, f"{prefix}.output")


def _feed_forward(g, block, h, prefix):
    ffn = block.feed_forward
    inner, outer = ffn.intermediate_dense.kernel.shape[-1], ffn.output_dense.kernel.shape[-1]
    w1, b1 = kernel_bias(ffn.intermediate_dense, inner)
    w2, b2 = kernel_bias(ffn.output_dense, outer)
    up = g.dense(h, w1, b1, f"{prefix}.ffn1")
    if ffn.gate_dense is None:
        h = g.activation(up, block.activation)
    else:  # gated (SwiGLU): act(x·W_g) ⊙ x·W_1
        wg, bg = kernel_bias(ffn.gate_dense, inner)
        h = g.op("Mul", [g.activation(g.dense(h, wg, bg, f"{prefix}.gate"), block.activation), up])
    return g.dense(h, w2, b2, f"{prefix}.ffn2")


def _rotary_tables(g, lm, max_length):
    """GroupQueryAttention's `cos_cache`, `sin_cache` `(max_length, key_dim / 2)` from the
    blocks' rotary settings (scaling included), or None."""
    rotary = _rotary(lm)
    if rotary is None:
        return None
    key_dim = lm.decoder_blocks[0].self_attention.key_dim
    inv_freq = inverse_frequencies(key_dim, *rotary).astype(np.float32)
    angles = np.arange(max_length, dtype=np.float32)[:, None] * inv_freq[None]  # as Keras
    return (g.const("rotary_cos", np.cos(angles)), g.const("rotary_sin", np.sin(angles)))


def weight_bytes(lm: "CachedCausalLM") -> int:
    """Bytes of the model's weights in float32, what the graph stores."""
    parts = [lm.token_embedding, lm.position_embedding, *lm.decoder_blocks, lm.final_norm, lm.head]
    return 4 * sum(int(np.prod(w.shape)) for p in parts if p is not None for w in p.weights)


def write_decode_graph(
    lm: "CachedCausalLM",
    path: str | Path,
    max_length: int,
    opset: int = 17,
    external_data: bool | None = None,
    weights: "WeightOnly | None" = None,
) -> dict[str, Any]:
    """Writes the decode-step graph of a causal LM's cached call (`CausalLM`, or
    `keras_attn.models.cached.FunctionalCausalLM`) to `path`; returns the
    spec the manifest records (`layers`, `kv_heads`, `key_dim`, `max_length`, names, and
    `external_data`: the file holding the weights, when they are outside the graph).

    `external_data`: write the weights to `<path>.data` beside the graph, each tensor as it is
    made (no copy of them is kept); `None` does so past `EXTERNAL_DATA_BYTES` (64 MiB) of
    float32 weights. `weights`: the projections and the token embedding weight-only quantized
    (`keras_attn_export.weight_only`), or None for float32."""
    import onnx

    reason = supported(lm)
    if reason is not None:
        raise ValueError(f"the decode graph cannot express this model: {reason}")
    # LayerNormalization needs opset 17; the graph needs onnxruntime (its contrib operators)
    # anyway, so an older export opset for model.onnx does not lower this one.
    opset = max(int(opset), 17)
    path = Path(path)
    if external_data is None:
        external_data = weight_bytes(lm) > EXTERNAL_DATA_BYTES
    data_path = path.with_name(path.name + ".data")
    with open(data_path, "wb") if external_data else contextlib.nullcontext() as data:
        model, spec = _decode_model(Graph(opset, data, weights), lm, max_length)
    spec["opset"] = opset
    onnx.save(model, str(path))
    # By path: the checker then also checks that the external data is where the graph says.
    onnx.checker.check_model(str(path))
    if external_data:
        spec["external_data"] = data_path.name
    return spec


def _embed(g: Graph, embeddings: np.ndarray) -> tuple[str, tuple[str, str] | None]:
    """`token_ids`' rows of the `(vocab, d)` table, and, when the table is quantized, the
    names of its integers and scales, which a tied output projection (`MatMulNBits`, K = d,
    N = vocab: the same layout) reads too. Quantized where whole blocks span d
    (`GatherBlockQuantized`), else a float32 Gather."""
    vocab, hidden = embeddings.shape
    if g.weights is None or hidden % g.weights.block_size:
        return g.op("Gather", [g.const("token_embedding", embeddings), "token_ids"]), None
    packed, scales = g.quantized("token_embedding", embeddings.T)
    blocks = hidden // g.weights.block_size
    rows = g.op(
        "GatherBlockQuantized",
        [packed, "token_ids", g.alias("token_embedding.scales_3d", scales, (vocab, blocks, 1))],
        domain="com.microsoft", gather_axis=0, quantize_axis=2,
        block_size=g.weights.block_size, bits=g.weights.bits,
    )  # fmt: skip
    # (batch, new, blocks, block) -> (batch, new, d)
    shape = g.const("embedded_shape", np.array([0, 0, hidden]))
    return g.op("Reshape", [rows, shape]), (packed, scales)


def _decode_model(g: Graph, lm: "CachedCausalLM", max_length: int) -> tuple[Any, dict[str, Any]]:
    """The decode-step graph as an ONNX model whose weights `g` holds (or wrote out), and the
    manifest's spec without `opset`."""
    from onnx import TensorProto, helper

    embeddings = layer_weights(lm.token_embedding)[0]  # (vocab, d)
    vocab, hidden = embeddings.shape
    tokens, quantized_table = _embed(g, embeddings)
    shape = g.op("Shape", ["token_ids"])  # (batch, new)
    new = g.op("Gather", [shape, g.const("one", np.array(1))])
    one = g.const("one_i32", np.array(1, np.int32))
    new_i32 = g.op("Cast", [new], to=TensorProto.INT32)
    # `index`: one position for every row (`(1,)`) or one per row (`(batch,)`, rows at
    # different lengths: iteration-level batching).
    batch = g.op(
        "Slice", [shape, g.const("zero_1d", np.array([0])), g.const("one_1d", np.array([1]))]
    )
    starts = g.op("Reshape", ["index", g.const("minus_one_1d", np.array([-1]))])
    end = g.op("Add", [starts, new_i32])  # each row's length after this step
    rotary = _rotary_tables(g, lm, max_length)
    x = tokens
    if lm.position_embedding is not None:  # else rotary: GroupQueryAttention places tokens
        table = np.asarray(
            lm.position_embedding(np.zeros((1, max_length, hidden), np.float32), start_index=0)
        ).reshape(max_length, hidden)
        offsets = g.op("Range", [g.const("zero_i32", np.array(0, np.int32)), new_i32, one])
        steps = g.op("Add", [g.op("Unsqueeze", [starts, "one_1d"]), offsets])  # (b or 1, new)
        x = g.op("Add", [tokens, g.op("Gather", [g.const("position_table", table), steps])])
    # GroupQueryAttention: seqlens_k = each row's length - 1; the longest length.
    seqlens = g.op("Expand", [g.op("Sub", [end, one]), batch])
    total = g.op("ReduceMax", [end], keepdims=0)

    inputs = [
        helper.make_tensor_value_info("token_ids", TensorProto.INT32, ["batch", "new"]),
        # One position for every row (`(1,)`) or one per row (`(batch,)`).
        helper.make_tensor_value_info("index", TensorProto.INT32, ["index_rows"]),
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
            (
                lambda h, n=n, p=p, a=attention: _attend(
                    g, a, h, n, p, hidden, seqlens, total, rotary
                )
            ),
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
    if lm.head is None:  # the token embedding, transposed, or its untied output matrix
        untied = lm.token_embedding.reverse_embeddings
        if untied is not None:
            untied = np.asarray(untied, np.float32)
        if g.weights is not None:
            if untied is not None or quantized_table is None:
                source = embeddings if untied is None else untied
                quantized_table = g.quantized("output_projection", source.T)
            attributes = g.weights.matmul_attributes(hidden, vocab)
            g.op("MatMulNBits", [x, *quantized_table], outputs=["logits"], domain="com.microsoft",
                 **attributes)  # fmt: skip
        else:
            # (vocab, d) tables, by Gemm's transB: no transposed copy. Tied: the embedding
            # table itself, stored once.
            output_table = "token_embedding"
            if untied is not None:
                output_table = g.const("output_projection", untied)
            g.op("Gemm", [x, output_table], outputs=["logits"], transB=1)
    else:
        kernel, bias = kernel_bias(lm.head, vocab)
        projected = g.matmul(x, kernel, "output_projection")
        if lm.head.bias is not None:
            g.op("Add", [projected, g.const("output_bias", bias)], outputs=["logits"])
        else:
            g.op("Identity", [projected], outputs=["logits"])

    graph = helper.make_graph(g.nodes, "decode_step", inputs, outputs, g.initializers)
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", g.opset), helper.make_opsetid("com.microsoft", 1)],
        producer_name="keras_attn_export.decode_graph",
        ir_version=8,  # what opset 17 needs; newer onnx writes versions onnxruntime refuses
    )
    return model, spec
