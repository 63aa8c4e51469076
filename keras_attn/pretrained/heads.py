"""The pretraining heads an encoder checkpoint carries (BERT's `cls.predictions.*` and
`cls.seq_relationship.*`, RoBERTa's `lm_head.*`), loaded into our tasks' head layers."""

import os
from collections.abc import Collection
from typing import Any

import keras
import numpy as np

from keras_attn.pretrained.folder import read_config, read_weights
from keras_attn.pretrained.tensors import Tensor, linear, norm

Head = tuple[dict[str, Tensor], dict[str, str]]


def _masked_lm(prefix: str, norm_name: str, bias: str) -> Head:
    """A masked-LM head's tensors (our variable path -> stored tensor), and the stored keys
    that must equal another tensor: the decoder weight is the word embedding, its bias the
    head's bias."""
    tensors = {
        **{f"mlm_head/dense/{k}": v for k, v in linear(f"{prefix}.dense").items()},
        **{f"mlm_head/layer_norm/{k}": v for k, v in norm(f"{prefix}.{norm_name}").items()},
        "mlm_output_bias/bias": Tensor(bias),
    }
    decoder = bias.rsplit(".", 1)[0] + ".decoder"
    return tensors, {f"{decoder}.weight": "embedding", f"{decoder}.bias": bias}


# model_type -> head name -> its layout
HEADS: dict[str, dict[str, Head]] = {
    "bert": {
        "mlm": _masked_lm("cls.predictions.transform", "LayerNorm", "cls.predictions.bias"),
        "nsp": ({f"nsp_head/{k}": v for k, v in linear("cls.seq_relationship").items()}, {}),
    },
    "roberta": {"mlm": _masked_lm("lm_head", "layer_norm", "lm_head.bias")},
}
HEADS["xlm-roberta"] = HEADS["camembert"] = HEADS["roberta"]
# The masked-LM head's activation where it is not the encoder's: `RobertaLMHead` (and its
# XLM-R and CamemBERT copies) applies exact GELU whatever the config's `hidden_act`.
HEAD_ACTIVATIONS = {"roberta": "gelu", "xlm-roberta": "gelu", "camembert": "gelu"}


def head_activation(folder: str | os.PathLike[str], backbone: Any) -> str:
    """The activation of this folder's pretraining heads: the family's own, else the
    encoder's (BERT's `hidden_act`, DistilBERT's `activation`)."""
    model_type = str(read_config(folder).get("model_type"))
    return HEAD_ACTIVATIONS.get(model_type, backbone.activation)


def head_keys(folder: str | os.PathLike[str], heads: Collection[str]) -> set[str]:
    """The checkpoint keys that `heads` of this folder's family read (the backbone's loader
    leaves them to `load_heads`)."""
    layouts = HEADS.get(str(read_config(folder).get("model_type")), {})
    keys: set[str] = set()
    for head in heads:
        tensors, tied = layouts.get(head, ({}, {}))
        keys |= {t.key for t in tensors.values()} | set(tied)
    return keys


def load_heads(task: Any, folder: str | os.PathLike[str], heads: Collection[str]) -> None:
    """Copies the checkpoint's `heads` into `task`'s head layers, when the checkpoint has
    them (a bare encoder's folder leaves the heads fresh).

    Raises:
        ValueError: a head stored in part, a tensor of the wrong shape, or a tied copy that
            differs from its source (naming the key).
    """
    layouts = HEADS.get(str(read_config(folder).get("model_type")), {})
    wanted = [layouts[h] for h in heads if h in layouts]
    if not wanted:
        return
    weights = read_weights(folder)
    variables = {v.path: v for v in task.weights}
    embedding = keras.ops.convert_to_numpy(task.backbone.token_embedding.embeddings)
    for tensors, tied in wanted:
        present = [t.key for t in tensors.values() if t.key in weights]
        if not present:
            continue  # this head is not in the checkpoint: it stays fresh
        missing = sorted({t.key for t in tensors.values()} - set(weights))
        if missing:
            raise ValueError(f"The checkpoint has part of a head; it lacks {missing}.")
        for path, tensor in tensors.items():
            if path not in variables:  # e.g. a task built with output_bias=False
                raise ValueError(
                    f"The checkpoint's {tensor.key!r} has no place in this "
                    f"{type(task).__name__} (it lacks {path!r}); build it with that part."
                )
            variable = variables[path]
            value = tensor.to_ours(weights[tensor.key], tuple(variable.shape))
            variable.assign(value.astype(variable.dtype))
        for key, source in tied.items():
            expected = embedding if source == "embedding" else weights[source]
            if key in weights and not np.array_equal(weights[key], expected):
                raise ValueError(
                    f"Checkpoint tensor {key!r} differs from the tensor it is tied to; only "
                    "tied masked-LM output layers are supported."
                )
