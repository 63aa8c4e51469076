"""What every checkpoint layout reads from and writes to `config.json` the same way: sizes,
activation names, the buffers a checkpoint may carry that are not weights, and the check that
a model can be written in a layout at all."""

from collections.abc import Sequence
from typing import Any

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


def activation(name: str) -> str:
    """Our activation for a `config.json`'s `hidden_act`."""
    if name not in ACTIVATIONS:
        raise ValueError(
            f"config.json's activation is not supported. Received: {name!r}; supported: "
            f"{sorted(ACTIVATIONS)}"
        )
    return ACTIVATIONS[name]


def hf_activation(model: Any) -> str:
    """The `hidden_act` of our model's activation."""
    if model.activation not in HF_ACTIVATIONS:
        raise ValueError(
            "`activation` has no Hugging Face name. Received: "
            f"activation={model.activation!r}; supported: {sorted(HF_ACTIVATIONS)}"
        )
    return HF_ACTIVATIONS[model.activation]


def require(config: dict[str, Any], *names: str) -> list[Any]:
    """The values of `names` in `config`, or a `ValueError` naming those it lacks."""
    missing = [name for name in names if name not in config]
    if missing:
        raise ValueError(f"config.json lacks {missing} (model_type {config.get('model_type')!r}).")
    return [config[name] for name in names]


def sizes(config: dict[str, Any], names: Sequence[str], **rest: Any) -> dict[str, Any]:
    """A backbone's sizes from `config.json` keys `names` (vocabulary, width, layers, heads,
    feed-forward width, positions), plus `rest`."""
    vocab, hidden, layers, heads, inner, positions = require(config, *names)
    return {
        "vocabulary_size": vocab,
        "max_sequence_length": positions,
        "hidden_dim": hidden,
        "num_layers": layers,
        "num_heads": heads,
        "intermediate_dim": inner,
        **rest,
    }


def check_exportable(model: Any, **expected: Any) -> None:
    """`save_pretrained` writes only what the architecture can express."""
    for name, value in expected.items():
        if getattr(model, name) != value:
            raise ValueError(
                f"This model cannot be written as a Hugging Face checkpoint: `{name}` must be "
                f"{value!r}. Received: {name}={getattr(model, name)!r}"
            )
