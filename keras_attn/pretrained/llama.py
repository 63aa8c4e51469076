"""The Llama family's checkpoint layout (Llama 2/3, Mistral, Qwen2, SmolLM, TinyLlama) into
`DecoderBackbone`; see `keras_attn.pretrained.registry.Layout` for what a layout answers."""

from typing import Any

from keras_attn.layers.rotary_embedding import ROPE_TYPES, check_rope_scaling
from keras_attn.pretrained.hf_config import activation, check_exportable, sizes
from keras_attn.pretrained.registry import BaseLayout, register_layout
from keras_attn.pretrained.tensors import Tensor, flatten, linear, table

LLAMA_ARCHITECTURES = {
    "llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
}  # fmt: skip
LLAMA_KEYS = (
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
    "max_position_embeddings", "hidden_act", "attention_bias", "mlp_bias", "num_key_value_heads",
    "head_dim", "attention_dropout", "rms_norm_eps", "rope_theta", "rope_scaling",
    "rope_parameters", "tie_word_embeddings", "pad_token_id", "sliding_window",
    "use_sliding_window", "max_window_layers", "layer_types",
)  # fmt: skip


def rope(config: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """`rope_theta` and the scaling dict (None for plain rotary) of a `config.json`, written
    by `transformers` 5 (`rope_parameters: {rope_type, rope_theta, ...}`) or 4 (top-level
    `rope_theta`, `rope_scaling`). A key present is never replaced by a default; scaling types
    other than linear and llama3 are refused by `check_rope_scaling`."""
    parameters = config.get("rope_parameters")
    legacy_theta, legacy_scaling = config.get("rope_theta"), config.get("rope_scaling")
    if parameters is None:
        theta = 10000.0 if legacy_theta is None else legacy_theta
        scaling = legacy_scaling
    else:
        if not isinstance(parameters, dict):
            raise ValueError(
                f"config.json's rope_parameters must be an object. Received: {parameters!r}"
            )
        if "rope_theta" not in parameters and legacy_theta is None:
            raise ValueError(f"config.json's rope_parameters lacks rope_theta: {parameters!r}")
        theta = parameters.get("rope_theta", legacy_theta)
        for name, value in (("rope_theta", legacy_theta), ("rope_scaling", legacy_scaling)):
            if value is not None and name == "rope_theta" and value != theta:
                raise ValueError(
                    f"config.json gives two rope_theta values: rope_theta={value!r} and "
                    f"rope_parameters.rope_theta={theta!r}"
                )
            if value is not None and name == "rope_scaling" and value != parameters:
                raise ValueError(
                    "config.json gives both rope_scaling and rope_parameters; they disagree: "
                    f"rope_scaling={value!r}, rope_parameters={parameters!r}"
                )
        scaling = {k: v for k, v in parameters.items() if k != "rope_theta"}
    if isinstance(theta, bool) or not isinstance(theta, int | float) or not theta > 0:
        raise ValueError(f"config.json's rope_theta must be a positive number. Received: {theta!r}")
    if isinstance(scaling, dict):
        kind = str(scaling.get("rope_type", scaling.get("type", "default")))
        extra = set(scaling) - {"rope_type", "type"} - set(ROPE_TYPES.get(kind, ()))
        if kind in ROPE_TYPES and extra:
            raise ValueError(
                f"config.json's rope settings have keys rope_type {kind!r} does not use: "
                f"{sorted(extra)}"
            )
        if kind == "default":
            scaling = None
    return float(theta), check_rope_scaling(scaling)


def attention_window(config: dict[str, Any], positions: int) -> int | None:
    """The sliding window every layer uses, or None for full attention; a mix of sliding and
    full layers is refused. Qwen2 slides only with `use_sliding_window`."""
    window = config.get("sliding_window")
    kind = config.get("model_type")
    layer_types = config.get("layer_types")
    if layer_types is not None:
        kinds = set(layer_types) if isinstance(layer_types, list) else {repr(layer_types)}
        if not kinds <= {"full_attention", "sliding_attention"} or len(kinds) > 1:
            raise ValueError(
                "config.json's layer_types must be all 'full_attention' or all "
                f"'sliding_attention'. Received: layer_types={layer_types!r}"
            )
        if len(layer_types) != config.get("num_hidden_layers"):
            raise ValueError(
                f"config.json's layer_types has {len(layer_types)} entries for "
                f"num_hidden_layers={config.get('num_hidden_layers')!r}"
            )
        if kinds == {"full_attention"}:
            return None
    elif kind == "qwen2" and not config.get("use_sliding_window", False):
        return None
    if window is None:
        if layer_types is not None:
            raise ValueError("config.json's layer_types slide, but sliding_window is null.")
        return None
    if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
        raise ValueError(
            f"config.json's sliding_window must be a positive integer. Received: {window!r}"
        )
    return window if window < positions else None


@register_layout
class Llama(BaseLayout):
    """The Llama family (Llama 2/3, Mistral, Qwen2, SmolLM, TinyLlama): pre-norm RMSNorm blocks,
    rotary queries and keys (`rope_theta`, `rope_scaling`), grouped-query attention, SwiGLU,
    no biases (Qwen2: biased q, k, v), an untied `lm_head` unless `tie_word_embeddings`."""

    model_types = ("llama", "mistral", "qwen2")
    prefixes = ("model.",)
    model_class = "DecoderBackbone"
    tied = (("lm_head.weight", "embed_tokens.weight"),)
    config_keys = LLAMA_KEYS

    def expected_shapes(self, kwargs: dict[str, Any]) -> dict[str, tuple[int, ...]]:
        """Checkpoint tensors (key -> shape) that config.json's sizes imply."""
        hidden, heads = kwargs["hidden_dim"], kwargs["num_heads"]
        head_dim = kwargs.get("head_dim") or hidden // heads
        kv = kwargs.get("num_key_value_heads") or heads
        layer = f"layers.{kwargs['num_layers'] - 1}"
        return {
            "embed_tokens.weight": (kwargs["vocabulary_size"], hidden),
            f"{layer}.self_attn.q_proj.weight": (heads * head_dim, hidden),
            f"{layer}.self_attn.k_proj.weight": (kv * head_dim, hidden),
            f"{layer}.mlp.up_proj.weight": (kwargs["intermediate_dim"], hidden),
        }

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
        window = attention_window(config, kwargs["max_sequence_length"])
        if window is not None:
            kwargs["max_sequence_length"] = window
        theta, scaling = rope(config)
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
            "rope_max_wavelength": theta,
            "rope_scaling": scaling,
            "tie_word_embeddings": bool(config.get("tie_word_embeddings", False)),
        }

    def stored_key(self, key: str) -> str:
        """The key written for `key`: `LlamaForCausalLM`'s (`model.` before all but
        `lm_head`), so `transformers` loads the folder as the causal LM it is."""
        return key if key == "lm_head.weight" else f"model.{key}"

    def writes(self, model: Any) -> str | None:
        """Rotary decoders: Qwen2 when only q, k, v have biases, else Llama."""
        if getattr(model, "position_encoding", None) != "rotary":
            return None
        qwen2 = model.attention_bias and model.attention_output_bias is False
        return "qwen2" if qwen2 else "llama"

    def hf_config(self, model: Any, model_type: str) -> dict[str, Any]:
        kind = model_type
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
            # transformers 5's form; it also reads the older top-level rope_theta/rope_scaling.
            "rope_parameters": {
                **(model.rope_scaling or {"rope_type": "default"}),
                "rope_theta": model.rope_max_wavelength,
            },
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
