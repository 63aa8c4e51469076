"""Float64 NumPy forwards of BERT, RoBERTa, DistilBERT and GPT-2, read straight from Hugging Face
checkpoint keys: the references `from_pretrained` is held to. Independent of our layers."""

import math

import numpy as np
from scipy.special import erf


def layer_norm(x, weights, prefix, epsilon):
    mean = x.mean(-1, keepdims=True)
    variance = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(variance + epsilon) * weights[f"{prefix}.weight"] + weights[
        f"{prefix}.bias"
    ]


def linear(x, weights, prefix):
    """PyTorch `nn.Linear`: weight `(out, in)`."""
    return x @ weights[f"{prefix}.weight"].T + weights[f"{prefix}.bias"]


def conv1d(x, weights, prefix):
    """GPT-2's `Conv1D`: weight `(in, out)`."""
    return x @ weights[f"{prefix}.weight"] + weights[f"{prefix}.bias"]


def gelu(x):
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def attention(q, k, v, heads, allowed):
    """softmax(q kᵀ / √d + mask) v per head; `allowed (B, T, S)` bool."""
    batch, length, width = q.shape
    d = width // heads

    def split(x):
        return x.reshape(batch, -1, heads, d).transpose(0, 2, 1, 3)

    scores = split(q) @ split(k).transpose(0, 1, 3, 2) / math.sqrt(d)
    scores = np.where(allowed[:, None], scores, -1e30)
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    weights = scores / scores.sum(-1, keepdims=True)
    return (weights @ split(v)).transpose(0, 2, 1, 3).reshape(batch, length, width)


BERT_KEYS = {
    "word": "embeddings.word_embeddings.weight",
    "position": "embeddings.position_embeddings.weight",
    "segment": "embeddings.token_type_embeddings.weight",
    "embedding_norm": "embeddings.LayerNorm",
    "layer": "encoder.layer.{i}",
    "query": "attention.self.query",
    "key": "attention.self.key",
    "value": "attention.self.value",
    "output": "attention.output.dense",
    "attention_norm": "attention.output.LayerNorm",
    "intermediate": "intermediate.dense",
    "ffn_output": "output.dense",
    "ffn_norm": "output.LayerNorm",
}
DISTILBERT_KEYS = {
    **BERT_KEYS,
    "segment": None,
    "layer": "transformer.layer.{i}",
    "query": "attention.q_lin",
    "key": "attention.k_lin",
    "value": "attention.v_lin",
    "output": "attention.out_lin",
    "attention_norm": "sa_layer_norm",
    "intermediate": "ffn.lin1",
    "ffn_output": "ffn.lin2",
    "ffn_norm": "output_layer_norm",
}


def bert_forward(
    weights, token_ids, segment_ids, padding, num_layers, heads, epsilon, keys=BERT_KEYS,
    position_offset=0, activation=gelu,
):  # fmt: skip
    """Post-norm BERT encoder: hidden states `(B, T, D)` in float64."""
    w = {k: v.astype("float64") for k, v in weights.items()}
    length = token_ids.shape[1]
    x = w[keys["word"]][token_ids] + w[keys["position"]][position_offset + np.arange(length)]
    if keys["segment"] is not None:
        x = x + w[keys["segment"]][segment_ids]
    x = layer_norm(x, w, keys["embedding_norm"], epsilon)
    allowed = np.broadcast_to(padding[:, None, :], (len(x), length, length))
    for i in range(num_layers):
        p = keys["layer"].format(i=i) + "."
        q, k, v = (linear(x, w, p + keys[n]) for n in ("query", "key", "value"))
        a = linear(attention(q, k, v, heads, allowed), w, p + keys["output"])
        x = layer_norm(x + a, w, p + keys["attention_norm"], epsilon)
        h = linear(activation(linear(x, w, p + keys["intermediate"])), w, p + keys["ffn_output"])
        x = layer_norm(x + h, w, p + keys["ffn_norm"], epsilon)
    return x


def gpt2_forward(weights, token_ids, num_layers, heads, epsilon=1e-5):
    """GPT-2 logits `(B, T, vocab)` in float64 (pre-norm, final norm, tied output)."""
    w = {k: v.astype("float64") for k, v in weights.items()}
    batch, length = token_ids.shape
    x = w["wte.weight"][token_ids] + w["wpe.weight"][np.arange(length)]
    causal = np.broadcast_to(np.tril(np.ones((length, length), bool)), (batch, length, length))
    for i in range(num_layers):
        p = f"h.{i}."
        q, k, v = np.split(
            conv1d(layer_norm(x, w, p + "ln_1", epsilon), w, p + "attn.c_attn"), 3, -1
        )
        x = x + conv1d(attention(q, k, v, heads, causal), w, p + "attn.c_proj")
        h = gelu_tanh(conv1d(layer_norm(x, w, p + "ln_2", epsilon), w, p + "mlp.c_fc"))
        x = x + conv1d(h, w, p + "mlp.c_proj")
    return layer_norm(x, w, "ln_f", epsilon) @ w["wte.weight"].T


def mean_pool_normalize(hidden, padding):
    """Sentence-transformers' mean pooling over real tokens, then L2 normalization."""
    mask = padding[..., None].astype("float64")
    pooled = (hidden * mask).sum(1) / np.maximum(mask.sum(1), 1e-9)
    return pooled / np.linalg.norm(pooled, axis=-1, keepdims=True)
