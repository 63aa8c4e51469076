"""The Llama family's checkpoint layout (Llama 2/3, Mistral, Qwen2, SmolLM, TinyLlama) into
`DecoderBackbone`; see `keras_attn.pretrained.layouts` for what a layout answers."""

from typing import Any

from keras_attn.pretrained.hf_config import activation, check_exportable, sizes
from keras_attn.pretrained.tensors import Tensor, flatten, linear, table

LLAMA_ARCHITECTURES = {
    "llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
}  # fmt: skip


class Llama:
    """The Llama family (Llama 2/3, Mistral, Qwen2, SmolLM, TinyLlama): pre-norm RMSNorm blocks,
    rotary queries and keys (`rope_theta`, `rope_scaling`), grouped-query attention, SwiGLU,
    no biases (Qwen2: biased q, k, v), an untied `lm_head` unless `tie_word_embeddings`."""

    model_types = ("llama", "mistral", "qwen2")
    prefixes = ("model.",)
    model_class = "DecoderBackbone"
    tied = (("lm_head.weight", "embed_tokens.weight"),)

    def model_kwargs(self, config: dict[str, Any], weights: dict[str, Any]) -> dict[str, Any]:
        names = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                 "intermediate_size", "max_position_embeddings")  # fmt: skip
        kwargs = sizes(config, names)
        kind, heads = config.get("model_type"), kwargs["num_heads"]
        if activation(config.get("hidden_act", "silu")) != "swish":
            raise ValueError(
                f"{kind} with hidden_act={config.get('hidden_act')!r} is not supported (silu)."
            )
        qkv_bias = kind == "qwen2" or bool(config.get("attention_bias", False))
        # A sliding window only changes sequences longer than it: cap the context there.
        window = config.get("sliding_window")
        if kind == "qwen2" and not config.get("use_sliding_window", False):
            window = None
        if isinstance(window, int) and 0 < window < kwargs["max_sequence_length"]:
            kwargs["max_sequence_length"] = window
        return {
            **kwargs,
            "num_key_value_heads": config.get("num_key_value_heads") or heads,
            "head_dim": config.get("head_dim") or kwargs["hidden_dim"] // heads,
            "dropout": config.get("attention_dropout", 0.0),
            "normalize_first": True,
            "activation": "swish",
            "position_encoding": "rotary",
            "mask_zero": False,
            "layer_norm_epsilon": config.get("rms_norm_eps", 1e-6),
            "normalization": "rms_norm",
            "gated_feed_forward": True,
            "attention_bias": qkv_bias,
            "attention_output_bias": False if kind == "qwen2" else qkv_bias,
            "feed_forward_bias": bool(config.get("mlp_bias", False)),
            "rope_max_wavelength": float(config.get("rope_theta", 10000.0)),
            "rope_scaling": config.get("rope_scaling"),
            "tie_word_embeddings": bool(config.get("tie_word_embeddings", False)),
        }

    def stored_key(self, key: str) -> str:
        """The key written for `key`: `LlamaForCausalLM`'s (`model.` before all but
        `lm_head`), so `transformers` loads the folder as the causal LM it is."""
        return key if key == "lm_head.weight" else f"model.{key}"

    def model_type_of(self, model: Any) -> str:
        """Qwen2 when only q, k, v have biases, else Llama."""
        qwen2 = model.attention_bias and model.attention_output_bias is False
        return "qwen2" if qwen2 else "llama"

    def hf_config(self, model: Any, model_type: str | None = None) -> dict[str, Any]:
        kind = model_type or self.model_type_of(model)
        check_exportable(
            model, normalize_first=True, position_encoding="rotary", normalization="rms_norm",
            gated_feed_forward=True, activation="swish",
        )  # fmt: skip
        if kind == "qwen2":
            check_exportable(
                model, attention_bias=True, attention_output_bias=False, feed_forward_bias=False
            )
        elif model.attention_output_bias not in (None, model.attention_bias):
            raise ValueError(
                f"model_type {kind!r} has one `attention_bias` for q, k, v and o. Received: "
                f"attention_bias={model.attention_bias}, "
                f"attention_output_bias={model.attention_output_bias}"
            )
        config = {
            "architectures": [LLAMA_ARCHITECTURES[kind]],
            "model_type": kind,
            "vocab_size": model.vocabulary_size,
            "hidden_size": model.hidden_dim,
            "intermediate_size": model.intermediate_dim or 4 * model.hidden_dim,
            "num_hidden_layers": model.num_layers,
            "num_attention_heads": model.num_heads,
            "num_key_value_heads": model.num_key_value_heads or model.num_heads,
            "head_dim": model.head_dim or model.hidden_dim // model.num_heads,
            "max_position_embeddings": model.max_sequence_length,
            "hidden_act": "silu",
            "rms_norm_eps": model.layer_norm_epsilon,
            "rope_theta": model.rope_max_wavelength,
            "rope_scaling": model.rope_scaling,
            "tie_word_embeddings": model.tie_word_embeddings,
            "attention_dropout": model.dropout,
            "torch_dtype": "float32",
        }
        if kind == "llama":
            config.update(attention_bias=model.attention_bias, mlp_bias=model.feed_forward_bias)
        else:
            check_exportable(model, feed_forward_bias=False)
            if kind == "mistral":
                check_exportable(model, attention_bias=False)
            config.update(sliding_window=None, use_sliding_window=False)
        return config

    def tensors(self, model: Any) -> dict[str, Tensor]:
        def rms(key: str) -> dict[str, Tensor]:
            return {"scale": Tensor(key)}

        embedding = {"embeddings": table("embed_tokens.weight")}
        if not model.tie_word_embeddings:
            embedding["reverse_embeddings"] = table("lm_head.weight")
        tree: dict[str, Any] = {
            "token_embedding": embedding,
            "final_layer_norm": rms("norm.weight"),
        }
        for i in range(model.num_layers):
            layer = f"layers.{i}"
            tree[f"decoder_block_{i}"] = {
                "self_attention": {
                    "query": linear(f"{layer}.self_attn.q_proj"),
                    "key": linear(f"{layer}.self_attn.k_proj"),
                    "value": linear(f"{layer}.self_attn.v_proj"),
                    "attention_output": linear(f"{layer}.self_attn.o_proj", in_axes=2),
                },
                "self_attention_layer_norm": rms(f"{layer}.input_layernorm.weight"),
                "feed_forward": {
                    "intermediate": linear(f"{layer}.mlp.up_proj"),
                    "gate": linear(f"{layer}.mlp.gate_proj"),
                    "output": linear(f"{layer}.mlp.down_proj"),
                },
                "feed_forward_layer_norm": rms(f"{layer}.post_attention_layernorm.weight"),
            }
        return flatten(tree)
