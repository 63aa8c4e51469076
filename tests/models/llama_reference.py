"""Tiny random Llama / Mistral / Qwen2 checkpoints in Hugging Face's layout, and a float64 NumPy
forward over them: the oracle that `from_pretrained` for these families is held to.

`forward` is an independent re-statement of transformers' eager `LlamaForCausalLM`,
`MistralForCausalLM` and `Qwen2ForCausalLM` forwards (read from `models/llama/modeling_llama.py`,
`models/mistral/modular_mistral.py`, `models/qwen2/modular_qwen2.py`, `modeling_rope_utils.py` and
`masking_utils.py`), written from the checkpoint keys alone; it shares no code with our layers.
Everything runs in float64, including the rotary angles, which transformers always forms in
float32: compare with a tolerance, not bit for bit.
"""

import json
import math
import pathlib
from typing import Any

import numpy as np
from safetensors.numpy import save_file

ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
}


def random_checkpoint(
    model_type: str, seed: int = 0, **overrides: Any
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """A tiny `(config, state_dict)` pair, float32, with transformers' keys and shapes.

    Matrices are N(0, 0.02²); RMSNorm weights are 1 + 0.1·N(0, 1) so that they matter.
    `overrides` update the config (e.g. `head_dim`, `rope_scaling`, `tie_word_embeddings`,
    `attention_bias`, `mlp_bias`, `sliding_window`) before the weights are drawn.
    """
    if model_type not in ARCHITECTURES:
        raise ValueError(
            f"`model_type` must be one of {sorted(ARCHITECTURES)}. "
            f"Received: model_type={model_type!r}"
        )
    config: dict[str, Any] = {
        "model_type": model_type,
        "architectures": [ARCHITECTURES[model_type]],
        "vocab_size": 97,
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 64,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0 if model_type == "qwen2" else 10000.0,
        "rope_scaling": None,
        "hidden_act": "silu",
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        # The small Qwen2 checkpoints (0.5B, 1.5B) tie the output projection to the embeddings.
        "tie_word_embeddings": model_type == "qwen2",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "use_cache": True,
        "torch_dtype": "float32",
    }
    if model_type == "llama":
        config.update(attention_bias=False, mlp_bias=False, pretraining_tp=1)
    elif model_type == "mistral":
        config.update(sliding_window=None)
    else:
        config.update(use_sliding_window=False, sliding_window=None)
    config.update(overrides)

    rng = np.random.default_rng(seed)
    hidden, heads, d = config["hidden_size"], config["num_attention_heads"], _head_dim(config)
    kv_heads = _kv_heads(config)
    attention_bias = model_type == "qwen2" or bool(config.get("attention_bias"))
    mlp_bias = model_type == "llama" and bool(config.get("mlp_bias"))

    def normal(*shape):
        return (0.02 * rng.standard_normal(shape)).astype("float32")

    def norm(size):
        return (1.0 + 0.1 * rng.standard_normal(size)).astype("float32")

    weights = {"model.embed_tokens.weight": normal(config["vocab_size"], hidden)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for name, rows in (("q", heads * d), ("k", kv_heads * d), ("v", kv_heads * d)):
            weights[f"{p}self_attn.{name}_proj.weight"] = normal(rows, hidden)
            if attention_bias:
                weights[f"{p}self_attn.{name}_proj.bias"] = normal(rows)
        weights[f"{p}self_attn.o_proj.weight"] = normal(hidden, heads * d)
        # Llama's `attention_bias` puts a bias on all four projections; Qwen2's o_proj has none.
        if attention_bias and model_type == "llama":
            weights[f"{p}self_attn.o_proj.bias"] = normal(hidden)
        for name, shape in (
            ("gate", (config["intermediate_size"], hidden)),
            ("up", (config["intermediate_size"], hidden)),
            ("down", (hidden, config["intermediate_size"])),
        ):
            weights[f"{p}mlp.{name}_proj.weight"] = normal(*shape)
            if mlp_bias:
                weights[f"{p}mlp.{name}_proj.bias"] = normal(shape[0])
        weights[f"{p}input_layernorm.weight"] = norm(hidden)
        weights[f"{p}post_attention_layernorm.weight"] = norm(hidden)
    weights["model.norm.weight"] = norm(hidden)
    if not config["tie_word_embeddings"]:
        weights["lm_head.weight"] = normal(config["vocab_size"], hidden)
    return config, weights


def _head_dim(config):
    return config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]


def _kv_heads(config):
    return config.get("num_key_value_heads") or config["num_attention_heads"]


def inverse_frequencies(config: dict[str, Any]) -> np.ndarray:
    """RoPE inverse frequencies `(head_dim // 2,)`, after `rope_scaling` (`modeling_rope_utils`)."""
    d = _head_dim(config)
    scaling = config.get("rope_scaling") or {}
    inv_freq = 1.0 / config.get("rope_theta", 10000.0) ** (np.arange(0, d, 2) / d)
    kind = scaling.get("rope_type", scaling.get("type", "default"))  # "type": the legacy key.
    if kind == "default":
        return inv_freq
    if kind == "linear":
        return inv_freq / scaling["factor"]
    if kind == "llama3":
        factor = scaling["factor"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_context = scaling["original_max_position_embeddings"]
        wavelength = 2 * math.pi / inv_freq
        smooth = (old_context / wavelength - low) / (high - low)
        medium = (1 - smooth) * inv_freq / factor + smooth * inv_freq
        return np.where(
            wavelength > old_context / low,
            inv_freq / factor,
            np.where(wavelength < old_context / high, inv_freq, medium),
        )
    raise ValueError(
        "`rope_scaling` must be None or of type 'default', 'linear' or 'llama3'. "
        f"Received: rope_scaling={scaling!r}"
    )


def _sliding_window(config):
    if config.get("use_sliding_window"):
        raise ValueError(
            "Qwen2's per-layer sliding window is not modelled. Received: use_sliding_window=True"
        )
    return config.get("sliding_window") if config["model_type"] == "mistral" else None


def _rms_norm(x, weight, epsilon):
    return weight * (x / np.sqrt((x**2).mean(-1, keepdims=True) + epsilon))


def _linear(x, w, prefix):
    """PyTorch `nn.Linear`: weight `(out, in)`, bias where the checkpoint has one."""
    y = x @ w[f"{prefix}.weight"].T
    return y + w[f"{prefix}.bias"] if f"{prefix}.bias" in w else y


def _rotate(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + np.concatenate([-x[..., half:], x[..., :half]], -1) * sin


def _attention(config, w, prefix, x, cos, sin, allowed):
    """Eager GQA self-attention; `cos`/`sin` `(B, 1, T, d)`, `allowed` `(B, 1, T, S)` bool."""
    batch, length, _ = x.shape
    heads, kv_heads, d = config["num_attention_heads"], _kv_heads(config), _head_dim(config)

    def split(y, n):
        return y.reshape(batch, length, n, d).transpose(0, 2, 1, 3)

    q = _rotate(split(_linear(x, w, f"{prefix}.q_proj"), heads), cos, sin)
    k = _rotate(split(_linear(x, w, f"{prefix}.k_proj"), kv_heads), cos, sin)
    v = split(_linear(x, w, f"{prefix}.v_proj"), kv_heads)
    # `repeat_kv`: query head j reads key/value head j // (heads // kv_heads).
    k, v = (np.repeat(t, heads // kv_heads, axis=1) for t in (k, v))
    scores = np.where(allowed, q @ k.transpose(0, 1, 3, 2) / math.sqrt(d), -1e30)
    # A finite fill keeps fully masked rows (left-pad queries) finite: uniform, never NaN.
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    out = ((scores / scores.sum(-1, keepdims=True)) @ v).transpose(0, 2, 1, 3)
    return _linear(out.reshape(batch, length, heads * d), w, f"{prefix}.o_proj")


def forward(
    config: dict[str, Any],
    weights: dict[str, np.ndarray],
    input_ids: np.ndarray,
    attention_mask: np.ndarray | None = None,
) -> np.ndarray:
    """Causal-LM logits `(batch, seq, vocab)` in float64.

    `attention_mask` `(batch, seq)`, 1 = real token, 0 = padding (left padding): keys at padded
    positions are masked out and positions count real tokens only (`cumsum(mask) - 1`, clipped at
    0), as `generate()` builds `position_ids`; a bare HF forward without `position_ids` would use
    0..seq-1 instead. Rows at padded query positions are meaningless: compare real positions only.

    Mistral's `sliding_window` w: query i sees keys j with i - w < j <= i, w keys including itself
    (`masking_utils.sliding_window_overlay`: `kv_idx > q_idx - sliding_window`; transformers before
    ~4.42 let w + 1 keys through). The window counts sequence slots, padded ones included.
    """
    if config.get("hidden_act", "silu") != "silu":
        raise ValueError(
            f"`hidden_act` must be 'silu'. Received: hidden_act={config['hidden_act']!r}"
        )
    w = {k: np.asarray(v, "float64") for k, v in weights.items()}
    input_ids = np.asarray(input_ids)
    batch, length = input_ids.shape
    if attention_mask is None:
        real = np.ones((batch, length), bool)
        positions = np.broadcast_to(np.arange(length), (batch, length))
    else:
        real = np.asarray(attention_mask).astype(bool)
        positions = np.maximum(np.cumsum(real, -1) - 1, 0)
    index = np.arange(length)
    allowed = index[None, :] <= index[:, None]  # (T, S)
    window = _sliding_window(config)
    if window is not None:
        allowed &= index[None, :] > index[:, None] - window
    allowed = (allowed[None] & real[:, None, :])[:, None]  # (B, 1, T, S)
    angles = positions[..., None] * inverse_frequencies(config)  # (B, T, d/2)
    angles = np.concatenate([angles, angles], -1)[:, None]  # (B, 1, T, d)
    cos, sin = np.cos(angles), np.sin(angles)
    epsilon = config["rms_norm_eps"]

    h = w["model.embed_tokens.weight"][input_ids]
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = _rms_norm(h, w[f"{p}input_layernorm.weight"], epsilon)
        h = h + _attention(config, w, f"{p}self_attn", x, cos, sin, allowed)
        x = _rms_norm(h, w[f"{p}post_attention_layernorm.weight"], epsilon)
        gate = _linear(x, w, f"{p}mlp.gate_proj")
        gate = gate / (1.0 + np.exp(-gate))  # SiLU
        h = h + _linear(gate * _linear(x, w, f"{p}mlp.up_proj"), w, f"{p}mlp.down_proj")
    h = _rms_norm(h, w["model.norm.weight"], epsilon)
    tied = config.get("tie_word_embeddings", False)
    return h @ w["model.embed_tokens.weight" if tied else "lm_head.weight"].T


def write_folder(
    path: str | pathlib.Path,
    config: dict[str, Any],
    weights: dict[str, np.ndarray],
    shards: int = 1,
) -> None:
    """Writes `config.json` and `model.safetensors`, or `shards` files and their index.

    Sharded: `model-0000i-of-0000N.safetensors` (keys split in order, contiguous runs) and
    `model.safetensors.index.json` with `metadata.total_size` (bytes) and `weight_map`, as
    `save_pretrained` writes them.
    """
    if not 1 <= shards <= len(weights):
        raise ValueError(
            f"`shards` must be between 1 and the number of tensors ({len(weights)}). "
            f"Received: shards={shards}"
        )
    folder = pathlib.Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tensors = {k: np.ascontiguousarray(v) for k, v in weights.items()}
    if shards == 1:
        save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
        return
    keys = list(tensors)
    weight_map = {}
    for i in range(shards):
        name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        chunk = keys[i * len(keys) // shards : (i + 1) * len(keys) // shards]
        save_file({k: tensors[k] for k in chunk}, folder / name, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(chunk, name))
    index = {
        "metadata": {"total_size": sum(t.nbytes for t in tensors.values())},
        "weight_map": weight_map,
    }
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
