"""T5 checkpoints (v1.0, v1.1, Flan-T5) into `Seq2SeqBackbone`: pre-norm RMSNorm blocks without
biases, unscaled dot-product scores plus a relative position bias per side, ReLU or gated GELU.
See `keras_attn.pretrained.registry.Layout`."""

from typing import Any, ClassVar

from keras_attn.pretrained.bart import fixed, special_ids
from keras_attn.pretrained.hf_config import activation, check_exportable, require
from keras_attn.pretrained.registry import BaseLayout, register_layout
from keras_attn.pretrained.tensors import Tensor, flatten, linear, table

T5_KEYS = (
    "vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_decoder_layers", "num_heads",
    "relative_attention_num_buckets", "relative_attention_max_distance", "dropout_rate",
    "layer_norm_epsilon", "feed_forward_proj", "dense_act_fn", "is_gated_act",
    "initializer_factor", "pad_token_id", "tie_word_embeddings", "scale_decoder_outputs",
    "is_encoder_decoder", "n_positions", "classifier_dropout",
)  # fmt: skip
# feed_forward_proj -> (our activation, gated)
FEED_FORWARDS = {
    "relu": ("relu", False),
    "gated-gelu": ("gelu_tanh", True),
    "gated-relu": ("relu", True),
    "gated-silu": ("swish", True),
}


@register_layout
class T5(BaseLayout):
    """T5: `shared` embeddings, `encoder.block.{i}.layer.{j}` sublayers, the relative bias
    table in block 0 of each side, final RMSNorms; the head tied and scaled by
    `d_model**-0.5` (v1.0), or its own `lm_head` unscaled (v1.1)."""

    model_types: ClassVar[tuple[str, ...]] = ("t5",)
    model_class: ClassVar[str] = "Seq2SeqBackbone"
    config_keys: ClassVar[tuple[str, ...]] = T5_KEYS
    tied: ClassVar[tuple[tuple[str, str], ...]] = (
        ("encoder.embed_tokens.weight", "shared.weight"),
        ("decoder.embed_tokens.weight", "shared.weight"),
    )
    ignored: ClassVar[tuple[str, ...]] = (
        "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight",
    )

    def model_kwargs(self, config: dict[str, Any], weights: dict[str, Any]) -> dict[str, Any]:
        vocab, hidden, layers, heads, inner = require(
            config, "vocab_size", "d_model", "num_layers", "num_heads", "d_ff"
        )
        proj = config.get("feed_forward_proj", "relu")
        if proj not in FEED_FORWARDS:
            raise ValueError(
                f"config.json's feed_forward_proj is not supported. Received: {proj!r}; "
                f"supported: {sorted(FEED_FORWARDS)}"
            )
        act, gated = FEED_FORWARDS[proj]
        # transformers writes what feed_forward_proj implies; anything else is refused.
        if "dense_act_fn" in config and activation(config["dense_act_fn"]) != act:
            raise ValueError(
                "config.json's dense_act_fn disagrees with its feed_forward_proj. Received: "
                f"dense_act_fn={config['dense_act_fn']!r}, feed_forward_proj={proj!r}"
            )
        if config.get("is_gated_act", gated) != gated:
            raise ValueError(
                "config.json's is_gated_act disagrees with its feed_forward_proj. Received: "
                f"is_gated_act={config['is_gated_act']!r}, feed_forward_proj={proj!r}"
            )
        fixed(config, is_encoder_decoder=True)
        # transformers: an explicit scale_decoder_outputs wins, else tie_word_embeddings;
        # the head is untied exactly when the checkpoint stores its own lm_head.
        scaled = config.get(
            "scale_decoder_outputs", config.get("tie_word_embeddings", True) is not False
        )
        positive = isinstance(hidden, int) and hidden > 0  # else check_sizes names it
        return {
            "vocabulary_size": vocab,
            "max_sequence_length": None,
            "hidden_dim": hidden,
            "num_encoder_layers": layers,
            "num_decoder_layers": config.get("num_decoder_layers") or layers,
            "num_heads": heads,
            "head_dim": config.get("d_kv", 64),  # transformers' default
            "intermediate_dim": inner,
            "dropout": config.get("dropout_rate", 0.1),
            "activation": act,
            "gated_feed_forward": gated,
            "normalize_first": True,
            "normalization": "rms_norm",
            "layer_norm_epsilon": config.get("layer_norm_epsilon", 1e-6),
            "position_encoding": "relative",
            "relative_attention_num_buckets": config.get("relative_attention_num_buckets", 32),
            "relative_attention_max_distance": config.get("relative_attention_max_distance", 128),
            "score": "dot",
            "attention_bias": False,
            "feed_forward_bias": False,
            "pad_token_id": config.get("pad_token_id", 0),
            "mask_decoder_padding": False,
            "tie_word_embeddings": "lm_head.weight" not in weights,
            "logit_scale": hidden**-0.5 if scaled and positive else 1.0,
            **special_ids(config, vocab, pad=0),
        }

    def expected_shapes(self, kwargs: dict[str, Any]) -> dict[str, tuple[int, ...]]:
        hidden, heads, ff = kwargs["hidden_dim"], kwargs["num_heads"], kwargs["intermediate_dim"]
        inner = heads * kwargs["head_dim"]
        buckets = kwargs["relative_attention_num_buckets"]
        last = f"encoder.block.{kwargs['num_encoder_layers'] - 1}.layer"
        last_decoder = f"decoder.block.{kwargs['num_decoder_layers'] - 1}.layer"
        wi = "wi_1" if kwargs["gated_feed_forward"] else "wi"
        shapes: dict[str, tuple[int, ...]] = {
            "shared.weight": (kwargs["vocabulary_size"], hidden),
            f"{last}.0.SelfAttention.q.weight": (inner, hidden),
            f"{last}.1.DenseReluDense.{wi}.weight": (ff, hidden),
            f"{last_decoder}.1.EncDecAttention.o.weight": (hidden, inner),
            f"{last_decoder}.2.DenseReluDense.wo.weight": (hidden, ff),
        }
        for side in ("encoder", "decoder"):
            key = f"{side}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
            shapes[key] = (buckets, heads)
        return shapes

    def writes(self, model: Any) -> str | None:
        return "t5" if model.position_encoding == "relative" else None

    def hf_config(self, model: Any, model_type: str) -> dict[str, Any]:
        check_exportable(
            model, normalize_first=True, normalization="rms_norm", attention_bias=False,
            feed_forward_bias=False, score="dot", target_vocabulary_size=None,
            output_bias=False, mask_decoder_padding=False, position_offset=0,
            scale_embedding=False, embedding_layer_norm=False, suppress_padding=False,
        )  # fmt: skip
        proj = {v: k for k, v in FEED_FORWARDS.items()}.get(
            (model.activation, model.gated_feed_forward)
        )
        if proj is None:
            raise ValueError(
                "This model cannot be written as a T5 checkpoint: its feed-forward has no "
                f"feed_forward_proj name. Received: activation={model.activation!r}, "
                f"gated_feed_forward={model.gated_feed_forward}"
            )
        scaled = model.logit_scale != 1.0
        if scaled and abs(model.logit_scale - model.hidden_dim**-0.5) > 1e-12:
            raise ValueError(
                "A T5 checkpoint scales its output by d_model**-0.5 or not at all. Received: "
                f"logit_scale={model.logit_scale!r}"
            )
        config = {
            "architectures": ["T5ForConditionalGeneration"],
            "model_type": model_type,
            "vocab_size": model.vocabulary_size,
            "d_model": model.hidden_dim,
            "d_kv": model.head_dim or model.hidden_dim // model.num_heads,
            "d_ff": model.intermediate_dim or 4 * model.hidden_dim,
            "num_layers": model.num_encoder_layers,
            "num_decoder_layers": model.num_decoder_layers,
            "num_heads": model.num_heads,
            "relative_attention_num_buckets": model.relative_attention_num_buckets,
            "relative_attention_max_distance": model.relative_attention_max_distance,
            "dropout_rate": model.dropout,
            "layer_norm_epsilon": model.layer_norm_epsilon,
            "feed_forward_proj": proj,
            "pad_token_id": model.pad_token_id,
            "is_encoder_decoder": True,
            "tie_word_embeddings": model.tie_word_embeddings,
            "scale_decoder_outputs": scaled,
        }
        for key in ("decoder_start_token_id", "forced_eos_token_id", "forced_bos_token_id"):
            if getattr(model, key) is not None:
                config[key] = getattr(model, key)
        return config

    def _side(self, side: str, layers: int, decoder: bool, gated: bool) -> dict[str, Any]:
        def scale(key: str) -> dict[str, Tensor]:
            return {"scale": Tensor(key)}

        def attention(prefix: str) -> dict[str, Any]:
            return {
                "query": linear(f"{prefix}.q"),
                "key": linear(f"{prefix}.k"),
                "value": linear(f"{prefix}.v"),
                "attention_output": linear(f"{prefix}.o", in_axes=2),
            }

        tree: dict[str, Any] = {
            f"{side}_relative_position_bias": {
                "embeddings": Tensor(
                    f"{side}.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                    in_axes=1,
                )
            },
            f"{side}_final_norm": scale(f"{side}.final_layer_norm.weight"),
        }
        for i in range(layers):
            block = f"{side}.block.{i}.layer"
            ff = f"{block}.{2 if decoder else 1}"
            entry: dict[str, Any] = {
                "self_attention": attention(f"{block}.0.SelfAttention"),
                "self_attention_layer_norm": scale(f"{block}.0.layer_norm.weight"),
                "feed_forward_layer_norm": scale(f"{ff}.layer_norm.weight"),
            }
            if decoder:
                entry["cross_attention"] = attention(f"{block}.1.EncDecAttention")
                entry["cross_attention_layer_norm"] = scale(f"{block}.1.layer_norm.weight")
            dense = f"{ff}.DenseReluDense"
            entry["feed_forward"] = {"output": linear(f"{dense}.wo")}
            if gated:
                entry["feed_forward"].update(
                    gate=linear(f"{dense}.wi_0"), intermediate=linear(f"{dense}.wi_1")
                )
            else:
                entry["feed_forward"]["intermediate"] = linear(f"{dense}.wi")
            tree[f"{side}_block_{i}"] = entry
        return tree

    def tensors(self, model: Any) -> dict[str, Tensor]:
        gated = model.gated_feed_forward
        embedding = {"embeddings": table("shared.weight")}
        if not model.tie_word_embeddings:
            embedding["reverse_embeddings"] = table("lm_head.weight")
        tree: dict[str, Any] = {
            "encoder_token_embedding": embedding,
            **self._side("encoder", model.num_encoder_layers, decoder=False, gated=gated),
            **self._side("decoder", model.num_decoder_layers, decoder=True, gated=gated),
        }
        return flatten(tree)
