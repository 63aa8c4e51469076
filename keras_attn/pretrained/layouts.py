"""Checkpoint key layouts: which Hugging Face tensor each of our variables is, per architecture.

An architecture answers three questions: the constructor arguments of our model for a
`config.json` (`model_kwargs`), the `config.json` of one of our models (`hf_config`), and the
checkpoint key of every variable (`tensors`, built of `keras_attn.pretrained.tensors.Tensor`,
which says how one variable is stored).
"""

from typing import Any

from keras_attn.pretrained.registry import model_class
from keras_attn.pretrained.tensors import (
    Tensor,
    attention_block,
    flatten,
    linear,
    norm,
    table,
)

# Buffers some checkpoints carry that are not weights (position ids, GPT-2's causal mask).
IGNORED_SUFFIXES = (
    "embeddings.position_ids", "attn.bias", "attn.masked_bias", "rotary_emb.inv_freq",
)  # fmt: skip


ACTIVATIONS = {  # Hugging Face's name -> ours
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "relu": "relu",
    "silu": "swish",
    "swish": "swish",
}
HF_ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "swish": "silu"}


def _activation(name):
    if name not in ACTIVATIONS:
        raise ValueError(
            f"config.json's activation is not supported. Received: {name!r}; supported: "
            f"{sorted(ACTIVATIONS)}"
        )
    return ACTIVATIONS[name]


def _hf_activation(model):
    if model.activation not in HF_ACTIVATIONS:
        raise ValueError(
            "`activation` has no Hugging Face name. Received: "
            f"activation={model.activation!r}; supported: {sorted(HF_ACTIVATIONS)}"
        )
    return HF_ACTIVATIONS[model.activation]


def _require(config, *names):
    missing = [name for name in names if name not in config]
    if missing:
        raise ValueError(f"config.json lacks {missing} (model_type {config.get('model_type')!r}).")
    return [config[name] for name in names]


def _sizes(config, names, **rest):
    """A backbone's sizes from `config.json` keys `names` (vocabulary, width, layers, heads,
    feed-forward width, positions), plus `rest`."""
    vocab, hidden, layers, heads, inner, positions = _require(config, *names)
    return {
        "vocabulary_size": vocab,
        "max_sequence_length": positions,
        "hidden_dim": hidden,
        "num_layers": layers,
        "num_heads": heads,
        "intermediate_dim": inner,
        **rest,
    }


def _encoder_kwargs(config, names, **rest):
    """`Encoder` sizes (see `_sizes`) with its padding id, plus `rest`."""
    return _sizes(config, names, pad_token_id=config.get("pad_token_id") or 0, **rest)


def _check_exportable(model, **expected):
    """`save_pretrained` writes only what the architecture can express."""
    for name, value in expected.items():
        if getattr(model, name) != value:
            raise ValueError(
                f"This model cannot be written as a Hugging Face checkpoint: `{name}` must be "
                f"{value!r}. Received: {name}={getattr(model, name)!r}"
            )


class Bert:
    """BERT, and every checkpoint in its key layout (MiniLM, sentence-transformers)."""

    model_types: tuple[str, ...] = ("bert",)
    prefixes: tuple[str, ...] = ("bert.",)
    model_class = "EncoderBackbone"

    def model_kwargs(self, config: dict[str, Any], weights: dict[str, Any]) -> dict[str, Any]:
        kind = config.get("position_embedding_type", "absolute")
        if kind != "absolute":
            raise ValueError(
                f"Only absolute position embeddings are supported. Received: "
                f"position_embedding_type={kind!r}"
            )
        names = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                 "intermediate_size", "max_position_embeddings")  # fmt: skip
        return _encoder_kwargs(
            config,
            names,
            dropout=config.get("hidden_dropout_prob", 0.1),
            num_segments=config.get("type_vocab_size", 2),
            activation=_activation(config.get("hidden_act", "gelu")),
            layer_norm_epsilon=config.get("layer_norm_eps", 1e-12),
            use_pooler="pooler.dense.weight" in weights,
        )

    architecture = "BertModel"

    def _position_offset(self, model):
        return 0

    def hf_config(self, model: Any) -> dict[str, Any]:
        _check_exportable(
            model,
            normalize_first=False,
            position_encoding="learned",
            position_offset=self._position_offset(model),
        )
        return {
            "architectures": [self.architecture],
            "model_type": self.model_types[0],
            "vocab_size": model.vocabulary_size,
            "hidden_size": model.hidden_dim,
            "num_hidden_layers": model.num_layers,
            "num_attention_heads": model.num_heads,
            "intermediate_size": model.intermediate_dim or 4 * model.hidden_dim,
            "max_position_embeddings": model.max_sequence_length,
            "type_vocab_size": model.num_segments or 0,
            "hidden_act": _hf_activation(model),
            "hidden_dropout_prob": model.dropout,
            "attention_probs_dropout_prob": model.dropout,
            "layer_norm_eps": model.layer_norm_epsilon,
            "pad_token_id": model.pad_token_id,
            "position_embedding_type": "absolute",
        }

    def _block_names(self, i):
        layer = f"encoder.layer.{i}"
        return {
            "query": f"{layer}.attention.self.query",
            "key": f"{layer}.attention.self.key",
            "value": f"{layer}.attention.self.value",
            "output": f"{layer}.attention.output.dense",
            "attention_norm": f"{layer}.attention.output.LayerNorm",
            "intermediate": f"{layer}.intermediate.dense",
            "ffn_output": f"{layer}.output.dense",
            "ffn_norm": f"{layer}.output.LayerNorm",
        }

    def _embeddings(self):
        return {
            "token_embedding": {"embeddings": table("embeddings.word_embeddings.weight")},
            "position_embedding": {"embeddings": table("embeddings.position_embeddings.weight")},
            "segment_embedding": {"embeddings": table("embeddings.token_type_embeddings.weight")},
            "embeddings_layer_norm": norm("embeddings.LayerNorm"),
        }

    def tensors(self, model: Any) -> dict[str, Tensor]:
        tree = {"embeddings": self._embeddings(), "pooler": linear("pooler.dense")}
        for i in range(model.num_layers):
            tree[f"encoder_block_{i}"] = attention_block(self._block_names(i))
        return flatten(tree)


class Roberta(Bert):
    """RoBERTa: BERT's keys under `roberta.`; padding id 1, positions counted from 2."""

    model_types = ("roberta", "xlm-roberta", "camembert")
    prefixes = ("roberta.",)

    def model_kwargs(self, config: dict[str, Any], weights: dict[str, Any]) -> dict[str, Any]:
        kwargs = super().model_kwargs(config, weights)
        pad = config.get("pad_token_id", 1)
        kwargs.update(pad_token_id=pad, position_offset=pad + 1)
        return kwargs

    architecture = "RobertaModel"

    def _position_offset(self, model):
        return model.pad_token_id + 1


class DistilBert:
    """DistilBERT: no segments, no pooler, its own key names."""

    model_types = ("distilbert",)
    prefixes = ("distilbert.",)
    model_class = "EncoderBackbone"

    def model_kwargs(self, config: dict[str, Any], weights: dict[str, Any]) -> dict[str, Any]:
        if config.get("sinusoidal_pos_embds"):
            raise ValueError("DistilBERT with sinusoidal_pos_embds=true is not supported.")
        names = ("vocab_size", "dim", "n_layers", "n_heads", "hidden_dim",
                 "max_position_embeddings")  # fmt: skip
        return _encoder_kwargs(
            config,
            names,
            dropout=config.get("dropout", 0.1),
            num_segments=None,
            activation=_activation(config.get("activation", "gelu")),
            layer_norm_epsilon=1e-12,
            use_pooler=False,
        )

    def hf_config(self, model: Any) -> dict[str, Any]:
        _check_exportable(
            model, normalize_first=False, position_encoding="learned", position_offset=0,
            num_segments=None, use_pooler=False, layer_norm_epsilon=1e-12,
        )  # fmt: skip
        return {
            "architectures": ["DistilBertModel"],
            "model_type": "distilbert",
            "vocab_size": model.vocabulary_size,
            "dim": model.hidden_dim,
            "n_layers": model.num_layers,
            "n_heads": model.num_heads,
            "hidden_dim": model.intermediate_dim or 4 * model.hidden_dim,
            "max_position_embeddings": model.max_sequence_length,
            "activation": _hf_activation(model),
            "dropout": model.dropout,
            "attention_dropout": model.dropout,
            "pad_token_id": model.pad_token_id,
            "sinusoidal_pos_embds": False,
        }

    def tensors(self, model: Any) -> dict[str, Tensor]:
        tree = {
            "embeddings": {
                "token_embedding": {"embeddings": table("embeddings.word_embeddings.weight")},
                "position_embedding": {
                    "embeddings": table("embeddings.position_embeddings.weight")
                },
                "embeddings_layer_norm": norm("embeddings.LayerNorm"),
            }
        }
        for i in range(model.num_layers):
            layer = f"transformer.layer.{i}"
            tree[f"encoder_block_{i}"] = attention_block(
                {
                    "query": f"{layer}.attention.q_lin",
                    "key": f"{layer}.attention.k_lin",
                    "value": f"{layer}.attention.v_lin",
                    "output": f"{layer}.attention.out_lin",
                    "attention_norm": f"{layer}.sa_layer_norm",
                    "intermediate": f"{layer}.ffn.lin1",
                    "ffn_output": f"{layer}.ffn.lin2",
                    "ffn_norm": f"{layer}.output_layer_norm",
                }
            )
        return flatten(tree)


class Gpt2:
    """GPT-2: pre-norm blocks, a final norm, tanh GELU, `Conv1D` weights `(in, out)` with q|k|v
    fused, token embedding tied to the output."""

    model_types = ("gpt2",)
    prefixes = ("transformer.",)
    model_class = "DecoderBackbone"
    tied = (("lm_head.weight", "wte.weight"),)  # (key, the key it must equal)

    def model_kwargs(self, config: dict[str, Any], weights: dict[str, Any]) -> dict[str, Any]:
        vocab, hidden, layers, heads, positions = _require(
            config, "vocab_size", "n_embd", "n_layer", "n_head", "n_positions"
        )
        for flag in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
            if config.get(flag):
                raise ValueError(f"GPT-2 with {flag}=true is not supported.")
        if config.get("scale_attn_weights") is False:
            raise ValueError("GPT-2 with scale_attn_weights=false is not supported.")
        return {
            "vocabulary_size": vocab,
            "max_sequence_length": positions,
            "hidden_dim": hidden,
            "num_layers": layers,
            "num_heads": heads,
            "intermediate_dim": config.get("n_inner") or 4 * hidden,
            "dropout": config.get("resid_pdrop", 0.1),
            "normalize_first": True,
            "activation": _activation(config.get("activation_function", "gelu_new")),
            "position_encoding": "learned",
            "mask_zero": False,
            "layer_norm_epsilon": config.get("layer_norm_epsilon", 1e-5),
        }

    def hf_config(self, model: Any) -> dict[str, Any]:
        _check_exportable(
            model, normalize_first=True, position_encoding="learned", normalization="layer_norm",
            gated_feed_forward=False, num_key_value_heads=None, head_dim=None,
            attention_bias=True, attention_output_bias=None, feed_forward_bias=True,
            tie_word_embeddings=True,
        )  # fmt: skip
        return {
            "architectures": ["GPT2LMHeadModel"],
            "model_type": "gpt2",
            "vocab_size": model.vocabulary_size,
            "n_embd": model.hidden_dim,
            "n_layer": model.num_layers,
            "n_head": model.num_heads,
            "n_inner": model.intermediate_dim or 4 * model.hidden_dim,
            "n_positions": model.max_sequence_length,
            "activation_function": _hf_activation(model),
            "resid_pdrop": model.dropout,
            "embd_pdrop": model.dropout,
            "attn_pdrop": model.dropout,
            "layer_norm_epsilon": model.layer_norm_epsilon,
        }

    def tensors(self, model: Any) -> dict[str, Tensor]:
        def conv1d(
            prefix: str, in_axes: int = 1, part: int = 0, parts: int = 1
        ) -> dict[str, Tensor]:
            return {
                "kernel": Tensor(f"{prefix}.weight", in_axes=in_axes, part=part, parts=parts),
                "bias": Tensor(f"{prefix}.bias", part=part, parts=parts),
            }

        tree: dict[str, Any] = {
            "token_embedding": {"embeddings": table("wte.weight")},
            "position_embedding": {"embeddings": table("wpe.weight")},
            "final_layer_norm": norm("ln_f"),
        }
        for i in range(model.num_layers):
            block = f"h.{i}"
            tree[f"decoder_block_{i}"] = {
                "self_attention_layer_norm": norm(f"{block}.ln_1"),
                "self_attention": {
                    name: conv1d(f"{block}.attn.c_attn", part=part, parts=3)
                    for part, name in enumerate(("query", "key", "value"))
                }
                | {"attention_output": conv1d(f"{block}.attn.c_proj", in_axes=2)},
                "feed_forward_layer_norm": norm(f"{block}.ln_2"),
                "feed_forward": {
                    "intermediate": conv1d(f"{block}.mlp.c_fc"),
                    "output": conv1d(f"{block}.mlp.c_proj"),
                },
            }
        return flatten(tree)


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
        kwargs = _sizes(config, names)
        kind, heads = config.get("model_type"), kwargs["num_heads"]
        if _activation(config.get("hidden_act", "silu")) != "swish":
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
        _check_exportable(
            model, normalize_first=True, position_encoding="rotary", normalization="rms_norm",
            gated_feed_forward=True, activation="swish",
        )  # fmt: skip
        if kind == "qwen2":
            _check_exportable(
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
            _check_exportable(model, feed_forward_bias=False)
            if kind == "mistral":
                _check_exportable(model, attention_bias=False)
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


Architecture = Bert | DistilBert | Gpt2 | Llama
ARCHITECTURES: tuple[Architecture, ...] = (Bert(), Roberta(), DistilBert(), Gpt2(), Llama())


def architecture_for_config(config: dict[str, Any]) -> Architecture:
    """The layout of a `config.json`, by its `model_type`."""
    model_type = config.get("model_type")
    for architecture in ARCHITECTURES:
        if model_type in architecture.model_types:
            return architecture
    supported = sorted(t for a in ARCHITECTURES for t in a.model_types)
    raise ValueError(
        f"config.json's model_type is not supported. Received: model_type={model_type!r}; "
        f"supported: {supported}"
    )


def architecture_for_model(model: Any, model_type: str | None = None) -> Architecture:
    """The layout to write `model` in: `model_type` if given, else inferred from the model
    (a decoder backbone with rotary positions is Llama, or Qwen2 with biases on q, k, v only,
    other decoders GPT-2; an encoder with a position offset RoBERTa, without segments and
    pooler DistilBERT, else BERT)."""
    if model_type is not None:
        architecture = architecture_for_config({"model_type": model_type})
    elif isinstance(model, model_class("DecoderBackbone")):
        rotary = getattr(model, "position_encoding", None) == "rotary"
        architecture = ARCHITECTURES[4] if rotary else ARCHITECTURES[3]
    elif getattr(model, "position_offset", 0):
        architecture = ARCHITECTURES[1]
    elif model.num_segments is None and not model.use_pooler:
        architecture = ARCHITECTURES[2]
    else:
        architecture = ARCHITECTURES[0]
    if not isinstance(model, model_class(architecture.model_class)):
        raise ValueError(
            f"model_type {architecture.model_types[0]!r} is a {architecture.model_class}. "
            f"Received: a {type(model).__name__}"
        )
    return architecture
