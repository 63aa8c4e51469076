"""The encoder layouts (BERT, RoBERTa, DistilBERT) and GPT-2's: which Hugging Face tensor
each of our variables is.

A layout (`keras_attn.pretrained.registry.Layout`) answers: the constructor arguments of our
model for a `config.json` (`model_kwargs`), the `config.json` of one of our models
(`hf_config`), and the checkpoint key of every variable (`tensors`, built of
`keras_attn.pretrained.tensors.Tensor`, which says how one variable is stored).
"""

from typing import Any, ClassVar

from keras_attn.pretrained.hf_config import (
    activation,
    check_exportable,
    hf_activation,
    sizes,
)
from keras_attn.pretrained.registry import BaseLayout, register_layout
from keras_attn.pretrained.tensors import (
    Tensor,
    attention_block,
    flatten,
    linear,
    norm,
    table,
)

BERT_KEYS = (
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
    "max_position_embeddings", "position_embedding_type", "hidden_dropout_prob",
    "attention_probs_dropout_prob", "type_vocab_size", "hidden_act", "layer_norm_eps",
    "pad_token_id", "tie_word_embeddings",
)  # fmt: skip
DISTILBERT_KEYS = (
    "vocab_size", "dim", "n_layers", "n_heads", "hidden_dim", "max_position_embeddings",
    "sinusoidal_pos_embds", "dropout", "attention_dropout", "activation", "pad_token_id",
    "qa_dropout", "seq_classif_dropout", "tie_word_embeddings", "tie_weights_",
)  # fmt: skip
GPT2_KEYS = (
    "vocab_size", "n_embd", "n_layer", "n_head", "n_inner", "n_positions", "n_ctx",
    "activation_function", "resid_pdrop", "embd_pdrop", "attn_pdrop", "layer_norm_epsilon",
    "scale_attn_weights", "scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn",
    "summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels",
    "summary_first_dropout", "tie_word_embeddings", "pad_token_id",
)  # fmt: skip


def _encoder_kwargs(config, names, **rest):
    """`Encoder` sizes (see `sizes`) with its padding id, plus `rest`."""
    return sizes(config, names, pad_token_id=config.get("pad_token_id") or 0, **rest)


@register_layout
class Bert(BaseLayout):
    """BERT, and every checkpoint in its key layout (MiniLM, sentence-transformers)."""

    model_types: ClassVar[tuple[str, ...]] = ("bert",)
    prefixes: ClassVar[tuple[str, ...]] = ("bert.",)
    model_class = "EncoderBackbone"
    config_keys = BERT_KEYS

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
            activation=activation(config.get("hidden_act", "gelu")),
            layer_norm_epsilon=config.get("layer_norm_eps", 1e-12),
            use_pooler="pooler.dense.weight" in weights,
        )

    architecture = "BertModel"

    def _position_offset(self, model):
        return 0

    def writes(self, model: Any) -> str | None:
        distilbert = model.num_segments is None and not model.use_pooler
        return None if model.position_offset or distilbert else "bert"

    def hf_config(self, model: Any, model_type: str) -> dict[str, Any]:
        check_exportable(
            model,
            normalize_first=False,
            position_encoding="learned",
            position_offset=self._position_offset(model),
        )
        return {
            "architectures": [self.architecture],
            "model_type": model_type,
            "vocab_size": model.vocabulary_size,
            "hidden_size": model.hidden_dim,
            "num_hidden_layers": model.num_layers,
            "num_attention_heads": model.num_heads,
            "intermediate_size": model.intermediate_dim or 4 * model.hidden_dim,
            "max_position_embeddings": model.max_sequence_length,
            "type_vocab_size": model.num_segments or 0,
            "hidden_act": hf_activation(model),
            "hidden_dropout_prob": model.dropout,
            "attention_probs_dropout_prob": model.dropout,
            "layer_norm_eps": model.layer_norm_epsilon,
            "pad_token_id": model.pad_token_id,
            "position_embedding_type": "absolute",
        }

    def expected_shapes(self, kwargs: dict[str, Any]) -> dict[str, tuple[int, ...]]:
        """Checkpoint tensors (key -> shape) that config.json's sizes imply."""
        hidden, last = kwargs["hidden_dim"], self._block_names(kwargs["num_layers"] - 1)
        shapes: dict[str, tuple[int, ...]] = {
            "embeddings.word_embeddings.weight": (kwargs["vocabulary_size"], hidden),
            "embeddings.position_embeddings.weight": (kwargs["max_sequence_length"], hidden),
            f"{last['intermediate']}.weight": (kwargs["intermediate_dim"], hidden),
        }
        if kwargs.get("num_segments"):
            shapes["embeddings.token_type_embeddings.weight"] = (kwargs["num_segments"], hidden)
        return shapes

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


@register_layout
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

    def writes(self, model: Any) -> str | None:
        return "roberta" if model.position_offset else None


@register_layout
class DistilBert(BaseLayout):
    """DistilBERT: no segments, no pooler, its own key names."""

    model_types = ("distilbert",)
    prefixes = ("distilbert.",)
    model_class = "EncoderBackbone"
    config_keys = DISTILBERT_KEYS

    def expected_shapes(self, kwargs: dict[str, Any]) -> dict[str, tuple[int, ...]]:
        """Checkpoint tensors (key -> shape) that config.json's sizes imply."""
        hidden, last = kwargs["hidden_dim"], kwargs["num_layers"] - 1
        return {
            "embeddings.word_embeddings.weight": (kwargs["vocabulary_size"], hidden),
            "embeddings.position_embeddings.weight": (kwargs["max_sequence_length"], hidden),
            f"transformer.layer.{last}.ffn.lin1.weight": (kwargs["intermediate_dim"], hidden),
        }

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
            activation=activation(config.get("activation", "gelu")),
            layer_norm_epsilon=1e-12,
            use_pooler=False,
        )

    def writes(self, model: Any) -> str | None:
        plain = not model.position_offset and model.num_segments is None
        return "distilbert" if plain and not model.use_pooler else None

    def hf_config(self, model: Any, model_type: str) -> dict[str, Any]:
        check_exportable(
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
            "activation": hf_activation(model),
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


@register_layout
class Gpt2(BaseLayout):
    """GPT-2: pre-norm blocks, a final norm, tanh GELU, `Conv1D` weights `(in, out)` with q|k|v
    fused, token embedding tied to the output."""

    model_types = ("gpt2",)
    prefixes = ("transformer.",)
    model_class = "DecoderBackbone"
    tied = (("lm_head.weight", "wte.weight"),)  # (key, the key it must equal)
    config_keys = GPT2_KEYS

    def expected_shapes(self, kwargs: dict[str, Any]) -> dict[str, tuple[int, ...]]:
        """Checkpoint tensors (key -> shape) that config.json's sizes imply."""
        hidden, last = kwargs["hidden_dim"], kwargs["num_layers"] - 1
        return {
            "wte.weight": (kwargs["vocabulary_size"], hidden),
            "wpe.weight": (kwargs["max_sequence_length"], hidden),
            f"h.{last}.mlp.c_fc.weight": (hidden, kwargs["intermediate_dim"]),
        }

    def model_kwargs(self, config: dict[str, Any], weights: dict[str, Any]) -> dict[str, Any]:
        # `n_inner` is optional in GPT-2's config.json (a missing `n_embd` is named by `sizes`).
        inner = config.get("n_inner") or 4 * config.get("n_embd", 0)
        names = ("vocab_size", "n_embd", "n_layer", "n_head", "n_inner", "n_positions")
        for flag in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
            if config.get(flag):
                raise ValueError(f"GPT-2 with {flag}=true is not supported.")
        if config.get("scale_attn_weights") is False:
            raise ValueError("GPT-2 with scale_attn_weights=false is not supported.")
        return sizes(
            {**config, "n_inner": inner},
            names,
            dropout=config.get("resid_pdrop", 0.1),
            normalize_first=True,
            activation=activation(config.get("activation_function", "gelu_new")),
            position_encoding="learned",
            mask_zero=False,
            layer_norm_epsilon=config.get("layer_norm_epsilon", 1e-5),
        )

    def writes(self, model: Any) -> str | None:
        return None if getattr(model, "position_encoding", None) == "rotary" else "gpt2"

    def hf_config(self, model: Any, model_type: str) -> dict[str, Any]:
        check_exportable(
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
            "activation_function": hf_activation(model),
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
