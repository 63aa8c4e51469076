"""BART and Marian checkpoints into `Seq2SeqBackbone`: post-norm encoder-decoders with biased
projections and an output bias (`final_logits_bias`), one embedding table shared by the
encoder, the decoder and the output projection. See `keras_attn.pretrained.registry.Layout`."""

from typing import Any, ClassVar

from keras_attn.pretrained.hf_config import activation, check_exportable, hf_activation, require
from keras_attn.pretrained.registry import BaseLayout, register_layout
from keras_attn.pretrained.tensors import Tensor, flatten, linear, norm, table

BART_KEYS = (
    "vocab_size", "d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads",
    "decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim", "max_position_embeddings",
    "activation_function", "dropout", "attention_dropout", "activation_dropout",
    "encoder_layerdrop", "decoder_layerdrop", "init_std", "scale_embedding", "pad_token_id",
    "tie_word_embeddings", "is_encoder_decoder", "num_hidden_layers", "classifier_dropout",
    "normalize_before", "add_final_layer_norm", "normalize_embedding",
    "static_position_embeddings", "add_bias_logits", "extra_pos_embeddings",
    "force_bos_token_to_be_generated",
)  # fmt: skip
MARIAN_KEYS = (*BART_KEYS, "decoder_vocab_size", "share_encoder_decoder_embeddings")


def _same(config: dict[str, Any], encoder: str, decoder: str) -> Any:
    """One value for both sides (our backbone has one), or a `ValueError` naming both."""
    first, second = require(config, encoder, decoder)
    if first != second:
        raise ValueError(
            f"Encoder and decoder must agree: {encoder}={first!r}, {decoder}={second!r} "
            f"(model_type {config.get('model_type')!r})."
        )
    return first


def special_ids(config: dict[str, Any], vocab: Any, pad: int) -> dict[str, Any]:
    """`pad_token_id`, `decoder_start_token_id`, `forced_eos_token_id` and
    `forced_bos_token_id` of a config (with its generation settings:
    `with_generation_defaults`), each inside the vocabulary."""
    forced = config.get("forced_eos_token_id")
    if isinstance(forced, list) and len(forced) == 1:  # `transformers` takes a list too
        forced = forced[0]
    ids = {
        "pad_token_id": config.get("pad_token_id", pad),
        "decoder_start_token_id": config.get("decoder_start_token_id"),
        "forced_eos_token_id": forced,
        "forced_bos_token_id": config.get("forced_bos_token_id"),
    }
    for name, value in ids.items():
        if value is None:
            continue
        bad = isinstance(value, bool) or not isinstance(value, int) or value < 0
        if bad or (isinstance(vocab, int) and value >= vocab):
            raise ValueError(
                f"The folder's {name} must be an id of its vocabulary [0, {vocab}). "
                f"Received: {name}={value!r}"
            )
    return ids


def fixed(config: dict[str, Any], **values: Any) -> None:
    """Keys of older configs, accepted only at the value that leaves the math as read."""
    for key, value in values.items():
        if key in config and config[key] != value:
            raise ValueError(
                f"config.json's {key} is not supported for model_type "
                f"{config.get('model_type')!r}. Received: {key}={config[key]!r}; supported: "
                f"{value!r}"
            )


@register_layout
class Bart(BaseLayout):
    """BART: learned positions from row 2, `layernorm_embedding`, GELU, post-norm blocks."""

    model_types: ClassVar[tuple[str, ...]] = ("bart",)
    prefixes: ClassVar[tuple[str, ...]] = ("model.",)
    model_class: ClassVar[str] = "Seq2SeqBackbone"
    config_keys: ClassVar[tuple[str, ...]] = BART_KEYS
    tied: ClassVar[tuple[tuple[str, str], ...]] = (
        ("lm_head.weight", "shared.weight"),
        ("encoder.embed_tokens.weight", "shared.weight"),
        ("decoder.embed_tokens.weight", "shared.weight"),
    )
    architecture = "BartForConditionalGeneration"
    # Older configs' switches at this family's values.
    legacy: ClassVar[dict[str, Any]] = {"normalize_before": False, "add_final_layer_norm": False,
              "normalize_embedding": True, "static_position_embeddings": False,
              "add_bias_logits": False, "extra_pos_embeddings": 2}  # fmt: skip

    def model_kwargs(self, config: dict[str, Any], weights: dict[str, Any]) -> dict[str, Any]:
        fixed(config, is_encoder_decoder=True, **self.legacy)
        if config.get("tie_word_embeddings") is False:
            raise ValueError(
                f"{self.model_types[0]} with tie_word_embeddings=false is not supported."
            )
        layers = require(config, "encoder_layers")[0]
        if config.get("num_hidden_layers", layers) != layers:
            raise ValueError(
                "config.json's num_hidden_layers must equal encoder_layers. Received: "
                f"num_hidden_layers={config['num_hidden_layers']!r}, encoder_layers={layers!r}"
            )
        vocab, hidden, decoder_layers = require(config, "vocab_size", "d_model", "decoder_layers")
        return {
            "vocabulary_size": vocab,
            "hidden_dim": hidden,
            "num_encoder_layers": layers,
            "num_decoder_layers": decoder_layers,
            "num_heads": _same(config, "encoder_attention_heads", "decoder_attention_heads"),
            "intermediate_dim": _same(config, "encoder_ffn_dim", "decoder_ffn_dim"),
            "dropout": config.get("dropout", 0.1),
            "activation": activation(config.get("activation_function", "gelu")),
            "mask_decoder_padding": False,
            "scale_embedding": bool(config.get("scale_embedding", False)),
            "output_bias": True,
            **special_ids(config, vocab, pad=1),
            **self._positions(config),
        }

    def _positions(self, config: dict[str, Any]) -> dict[str, Any]:
        return {
            "max_sequence_length": require(config, "max_position_embeddings")[0],
            "position_encoding": "learned",
            "position_offset": 2,
            "embedding_layer_norm": True,
        }

    def expected_shapes(self, kwargs: dict[str, Any]) -> dict[str, tuple[int, ...]]:
        hidden, ff = kwargs["hidden_dim"], kwargs["intermediate_dim"]
        encoder = f"encoder.layers.{kwargs['num_encoder_layers'] - 1}"
        decoder = f"decoder.layers.{kwargs['num_decoder_layers'] - 1}"
        shapes: dict[str, tuple[int, ...]] = {
            "shared.weight": (kwargs["vocabulary_size"], hidden),
            f"{encoder}.fc1.weight": (ff, hidden),
            f"{decoder}.fc2.weight": (hidden, ff),
            f"{decoder}.encoder_attn.q_proj.weight": (hidden, hidden),
            "final_logits_bias": (1, kwargs["vocabulary_size"]),
        }
        if self._has_positions:
            rows = kwargs["max_sequence_length"] + kwargs["position_offset"]
            for side in ("encoder", "decoder"):
                shapes[f"{side}.embed_positions.weight"] = (rows, hidden)
        return shapes

    def writes(self, model: Any) -> str | None:
        bart = model.position_encoding == "learned" and model.position_offset == 2
        return self.model_types[0] if bart and not model.normalize_first else None

    # What our model must say for this layout to express it (beyond the sizes).
    fixed: ClassVar[dict[str, Any]] = {
        "normalize_first": False, "normalization": "layer_norm", "gated_feed_forward": False,
        "attention_bias": True, "feed_forward_bias": True, "score": "scaled_dot",
        "target_vocabulary_size": None, "tie_word_embeddings": True, "logit_scale": 1.0,
        "output_bias": True, "head_dim": None, "mask_decoder_padding": False,
        "suppress_padding": False, "layer_norm_epsilon": 1e-5, "position_encoding": "learned",
        "position_offset": 2, "embedding_layer_norm": True,
    }  # fmt: skip

    def hf_config(self, model: Any, model_type: str) -> dict[str, Any]:
        check_exportable(model, **self.fixed)
        config = {
            "architectures": [self.architecture],
            "model_type": model_type,
            "vocab_size": model.vocabulary_size,
            "d_model": model.hidden_dim,
            "encoder_layers": model.num_encoder_layers,
            "decoder_layers": model.num_decoder_layers,
            "encoder_attention_heads": model.num_heads,
            "decoder_attention_heads": model.num_heads,
            "encoder_ffn_dim": model.intermediate_dim or 4 * model.hidden_dim,
            "decoder_ffn_dim": model.intermediate_dim or 4 * model.hidden_dim,
            "max_position_embeddings": model.max_sequence_length,
            "activation_function": hf_activation(model),
            "dropout": model.dropout,
            "attention_dropout": 0.0,
            "activation_dropout": 0.0,
            "scale_embedding": model.scale_embedding,
            "pad_token_id": model.pad_token_id,
            "is_encoder_decoder": True,
            "tie_word_embeddings": True,
        }
        if model.decoder_start_token_id is not None:
            config["decoder_start_token_id"] = model.decoder_start_token_id
        # Written even when None: the config class would read its absence as its default.
        config["forced_eos_token_id"] = model.forced_eos_token_id
        if model.forced_bos_token_id is not None:  # the config class's default is None
            config["forced_bos_token_id"] = model.forced_bos_token_id
        return config

    def stored_key(self, key: str) -> str:
        """`BartForConditionalGeneration`'s keys: `model.` before all but the output bias."""
        return key if key in ("final_logits_bias", "lm_head.weight") else f"model.{key}"

    def _side(self, side: str, layers: int, decoder: bool) -> dict[str, Any]:
        tree: dict[str, Any] = {}
        if self._has_positions:
            tree[f"{side}_positions"] = {"embeddings": table(f"{side}.embed_positions.weight")}
        if self._has_embedding_norm:
            tree[f"{side}_embeddings_layer_norm"] = norm(f"{side}.layernorm_embedding")
        for i in range(layers):
            layer = f"{side}.layers.{i}"

            def attention(name: str, layer: str = layer) -> dict[str, Any]:
                return {
                    "query": linear(f"{layer}.{name}.q_proj"),
                    "key": linear(f"{layer}.{name}.k_proj"),
                    "value": linear(f"{layer}.{name}.v_proj"),
                    "attention_output": linear(f"{layer}.{name}.out_proj", in_axes=2),
                }

            block = {
                "self_attention": attention("self_attn"),
                "self_attention_layer_norm": norm(f"{layer}.self_attn_layer_norm"),
                "feed_forward": {
                    "intermediate": linear(f"{layer}.fc1"),
                    "output": linear(f"{layer}.fc2"),
                },
                "feed_forward_layer_norm": norm(f"{layer}.final_layer_norm"),
            }
            if decoder:
                block["cross_attention"] = attention("encoder_attn")
                block["cross_attention_layer_norm"] = norm(f"{layer}.encoder_attn_layer_norm")
            tree[f"{side}_block_{i}"] = block
        return tree

    _has_positions = True
    _has_embedding_norm = True

    def tensors(self, model: Any) -> dict[str, Tensor]:
        tree: dict[str, Any] = {
            "encoder_token_embedding": {
                "embeddings": table("shared.weight"),
                "reverse_bias": Tensor("final_logits_bias", row=True),
            },
            **self._side("encoder", model.num_encoder_layers, decoder=False),
            **self._side("decoder", model.num_decoder_layers, decoder=True),
        }
        return flatten(tree)


@register_layout
class Marian(Bart):
    """Marian (MarianMT, opus-mt): BART's keys without `layernorm_embedding`; sinusoidal
    positions (sines, then cosines) that are not stored; swish; decoder start = padding id."""

    model_types: ClassVar[tuple[str, ...]] = ("marian",)
    config_keys: ClassVar[tuple[str, ...]] = MARIAN_KEYS
    architecture = "MarianMTModel"
    legacy: ClassVar[dict[str, Any]] = {"normalize_before": False, "add_final_layer_norm": False,
              "normalize_embedding": False, "static_position_embeddings": True,
              "add_bias_logits": False}  # fmt: skip
    _has_positions = False
    _has_embedding_norm = False

    def model_kwargs(self, config: dict[str, Any], weights: dict[str, Any]) -> dict[str, Any]:
        vocab = config.get("vocab_size")
        if config.get("decoder_vocab_size", vocab) not in (None, vocab):
            raise ValueError(
                "Marian with a separate decoder vocabulary is not supported. Received: "
                f"decoder_vocab_size={config['decoder_vocab_size']!r}, vocab_size={vocab!r}"
            )
        fixed(config, share_encoder_decoder_embeddings=True)
        defaults = {"activation_function": "swish", "pad_token_id": 58100}
        kwargs = super().model_kwargs({**defaults, **config}, weights)
        if kwargs["decoder_start_token_id"] is None:
            kwargs["decoder_start_token_id"] = kwargs["pad_token_id"]
        # opus-mt's generation settings ban the padding id (`bad_words_ids=[[pad]]`).
        banned = config.get("bad_words_ids") or []
        if banned not in ([], [[kwargs["pad_token_id"]]]):
            raise ValueError(
                "config's bad_words_ids must be [] or [[pad_token_id]] (opus-mt's padding ban; "
                f"other banned words are not supported). Received: {banned!r:.80}"
            )
        kwargs["suppress_padding"] = bool(banned)
        return kwargs

    def _positions(self, config: dict[str, Any]) -> dict[str, Any]:
        # The encoding has no table; the length is kept for the round trip.
        return {
            "max_sequence_length": config.get("max_position_embeddings"),
            "position_encoding": "sinusoidal_halves",
        }

    def writes(self, model: Any) -> str | None:
        marian = model.position_encoding == "sinusoidal_halves" and not model.normalize_first
        return "marian" if marian else None

    fixed: ClassVar[dict[str, Any]] = {
        **{k: v for k, v in Bart.fixed.items() if k != "suppress_padding"},
        "position_encoding": "sinusoidal_halves", "position_offset": 0,
        "embedding_layer_norm": False,
    }  # fmt: skip

    def hf_config(self, model: Any, model_type: str) -> dict[str, Any]:
        config = super().hf_config(model, model_type)
        config.update(
            max_position_embeddings=model.max_sequence_length,
            decoder_vocab_size=model.vocabulary_size,
            share_encoder_decoder_embeddings=True,
            decoder_start_token_id=(
                model.pad_token_id
                if model.decoder_start_token_id is None
                else model.decoder_start_token_id
            ),
        )
        if model.suppress_padding:  # read back by transformers as a generation setting
            config["bad_words_ids"] = [[model.pad_token_id]]
        return config
