"""float64 NumPy references for the Transformer blocks, reading weights from our layers."""

import math

import numpy as np

from tests.helpers import to_numpy

_erf = np.vectorize(math.erf)

ACTIVATIONS = {
    "relu": lambda x: np.maximum(x, 0.0),
    "gelu": lambda x: 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0))),
    "gelu_tanh": lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
    "swish": lambda x: x / (1.0 + np.exp(-x)),
}


def w(variable):
    return to_numpy(variable).astype("float64")


def layer_norm(layer, x):
    mean = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + layer.epsilon) * w(layer.gamma) + w(layer.beta)


def multi_head_attention(layer, query, value, mask):
    """mask: bool (B, T, S) or None; rows with no visible key give zeros before W_O."""
    q = np.einsum("btd,dhk->bthk", query, w(layer.query_dense.kernel)) + w(layer.query_dense.bias)
    k = np.einsum("bsd,dhk->bshk", value, w(layer.key_dense.kernel)) + w(layer.key_dense.bias)
    v = np.einsum("bsd,dhk->bshk", value, w(layer.value_dense.kernel)) + w(layer.value_dense.bias)
    reps = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, reps, axis=2), np.repeat(v, reps, axis=2)
    scores = np.einsum("bthk,bshk->bhts", q, k) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = np.where(mask[:, None], scores, -np.inf)
    peak = np.max(scores, axis=-1, keepdims=True)
    peak = np.where(np.isfinite(peak), peak, 0.0)
    e = np.exp(scores - peak)
    total = e.sum(-1, keepdims=True)
    weights = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
    out = np.einsum("bhts,bshv->bthv", weights, v)
    kernel, bias = w(layer.output_dense.kernel), w(layer.output_dense.bias)
    return np.einsum("bthv,hvd->btd", out, kernel) + bias


def feed_forward(layer, x, activation):
    h = x @ w(layer.intermediate_dense.kernel) + w(layer.intermediate_dense.bias)
    return ACTIVATIONS[activation](h) @ w(layer.output_dense.kernel) + w(layer.output_dense.bias)


def residual(x, norm, fn, pre_norm):
    if pre_norm:
        return x + fn(layer_norm(norm, x))
    return layer_norm(norm, x + fn(x))


def self_attention_sublayer(block, x, mask):
    return residual(
        x,
        block.self_attention_layer_norm,
        lambda h: multi_head_attention(block.self_attention, h, h, mask),
        block.normalize_first,
    )


def feed_forward_sublayer(block, x):
    return residual(
        x,
        block.feed_forward_layer_norm,
        lambda h: feed_forward(block.feed_forward, h, block.activation),
        block.normalize_first,
    )


def encoder(block, x, key_padding=None, causal=False):
    t = x.shape[1]
    mask = np.ones((x.shape[0], t, t), bool)
    if key_padding is not None:
        mask &= key_padding[:, None, :] & key_padding[:, :, None]
    if causal:
        mask &= np.tril(np.ones((t, t), bool))
    return feed_forward_sublayer(block, self_attention_sublayer(block, x, mask))


def decoder(block, x, enc=None, dec_padding=None, enc_padding=None):
    b, t = x.shape[:2]
    mask = np.tril(np.ones((t, t), bool))[None].repeat(b, 0)
    if dec_padding is not None:
        mask &= dec_padding[:, None, :] & dec_padding[:, :, None]
    x = self_attention_sublayer(block, x, mask)
    if enc is not None:
        cross = np.ones((b, t, enc.shape[1]), bool)
        if enc_padding is not None:
            cross &= enc_padding[:, None, :]
        if dec_padding is not None:
            cross &= dec_padding[:, :, None]
        x = residual(
            x,
            block.cross_attention_layer_norm,
            lambda h: multi_head_attention(block.cross_attention, h, enc, cross),
            block.normalize_first,
        )
    return feed_forward_sublayer(block, x)
