"""Pretrained checkpoints in and out, in the Hugging Face folder layout, with no network.

`load_pretrained(folder)` (also each backbone's and each task's `from_pretrained`) builds our
backbone from `config.json` and copies every tensor of `model.safetensors` into it;
`save_pretrained(model, folder)` writes the same layout back. Layouts: BERT (MiniLM,
sentence-transformers folders), RoBERTa and DistilBERT into `EncoderBackbone`; GPT-2, Llama,
Mistral and Qwen2 into `DecoderBackbone` (see `keras_attn.pretrained.layouts` and
`keras_attn.pretrained.llama`).

Every checkpoint tensor is either copied, a known buffer (position ids, GPT-2's causal mask),
a tied copy (GPT-2's `lm_head.weight`), or named in a `ValueError`; a tensor whose shape
disagrees with `config.json` is named with both shapes.
"""

import os
from collections.abc import Collection
from typing import Any

import keras
import numpy as np

from keras_attn.pretrained.folder import (
    FLOAT_DTYPES,
    read_config,
    read_header,
    read_pooling,
    read_vocabulary,
    read_weights,
    with_generation_defaults,
)
from keras_attn.pretrained.hf_config import IGNORED_SUFFIXES, check_keys, check_sizes
from keras_attn.pretrained.registry import layout_for_config, layout_for_model
from keras_attn.pretrained.registry import model_class as registered_class

# Each family's module registers its layout when imported.
from keras_attn.pretrained import bart, layouts, llama, t5  # noqa: F401  isort: skip

__all__ = ["load_pretrained", "read_pooling", "read_vocabulary", "save_pretrained"]


def _strip_prefixes(weights, prefixes):
    """Keys of a task checkpoint (`bert.encoder…`) as the base model's (`encoder…`)."""
    out = {}
    for key, value in weights.items():
        for prefix in prefixes:
            if key.startswith(prefix):
                key = key[len(prefix) :]
                break
        out[key] = value
    return out


def _listed(keys, limit=12):
    keys = sorted(keys)
    more = f" and {len(keys) - limit} more" if len(keys) > limit else ""
    return ", ".join(keys[:limit]) + more


def load_pretrained(
    folder: str | os.PathLike[str],
    model_class: type | None = None,
    strict: bool = True,
    head_keys: Collection[str] = (),
    **overrides: Any,
) -> Any:
    """Builds our model for a Hugging Face folder and copies its weights in.

    Args:
        folder: path of a folder with `config.json` and `model.safetensors` (or a sharded
            index). `pytorch_model.bin` is refused: it is a pickle.
        model_class: `EncoderBackbone` or `DecoderBackbone` (or a subclass); defaults to the
            one the architecture needs.
        strict: bool. Checkpoint tensors the model does not use (a pretraining head's
            `cls.*`, a classifier) raise a `ValueError` naming them; `False` drops them.
        head_keys: checkpoint keys a task's head reads itself (`keras_attn.pretrained.heads`):
            not the backbone's, and not unused.
        **overrides: constructor arguments that replace those read from `config.json`
            (e.g. `dropout=0.0`); they must keep every weight's shape.
    Returns:
        the model, its weights equal to the checkpoint's.
    Raises:
        ValueError: unsupported architecture or config, a missing or unused tensor, or a
            tensor whose shape disagrees with `config.json` (key and both shapes named).
    """
    config = with_generation_defaults(folder, read_config(folder))
    architecture = layout_for_config(config)
    expected = registered_class(architecture.model_class)
    if model_class is not None and not issubclass(model_class, expected):
        raise ValueError(
            f"model_type {config.get('model_type')!r} loads into {architecture.model_class}. "
            f"Received: model_class={model_class.__name__}"
        )
    # Everything the files say is checked against each other before anything is allocated.
    check_keys(config, architecture.config_keys)
    header = _strip_prefixes(read_header(folder), architecture.prefixes)
    not_float = {
        key: dtype
        for key, (dtype, _) in header.items()
        if dtype not in FLOAT_DTYPES and not key.endswith(IGNORED_SUFFIXES)
    }
    if not_float:
        shown = dict(sorted(not_float.items())[:4])
        raise ValueError(
            f"Checkpoint weights must be floating point ({', '.join(FLOAT_DTYPES)}). "
            f"Received: {shown}"
        )
    kwargs = architecture.model_kwargs(config, header)
    check_sizes(kwargs, {key: shape for key, (_, shape) in header.items()},
                architecture.expected_shapes(kwargs))  # fmt: skip
    kwargs.update(overrides)
    weights = _strip_prefixes(read_weights(folder), architecture.prefixes)
    model = (model_class or expected)(**kwargs)
    _copy_in(model, architecture, weights, strict, set(head_keys))
    model.from_checkpoint = True  # a task's compile() then defaults to a fine-tuning rate
    return model


def _copy_in(model, architecture, weights, strict, head_keys):
    tensors = architecture.tensors(model)
    unmapped = [v.path for v in model.weights if v.path not in tensors]
    if unmapped:
        raise ValueError(f"No checkpoint key is known for the model's variables {unmapped}.")
    missing = [tensors[v.path].key for v in model.weights if tensors[v.path].key not in weights]
    if missing:
        raise ValueError(f"The checkpoint lacks tensors the model needs: {_listed(set(missing))}")
    consumed = set()
    for variable in model.weights:
        entry = tensors[variable.path]
        value = entry.to_ours(weights[entry.key], tuple(variable.shape))
        variable.assign(value.astype(variable.dtype))
        consumed.add(entry.key)
    for key, source in getattr(architecture, "tied", ()):
        if key in weights and key not in consumed:  # an untied model reads it as a weight
            if not np.array_equal(weights[key], weights.get(source)):
                raise ValueError(
                    f"Checkpoint tensor {key!r} differs from {source!r}; only tied output "
                    "embeddings are supported."
                )
            consumed.add(key)
    consumed.update(key for key in (*architecture.ignored, *head_keys) if key in weights)
    unused = {
        key
        for key in weights
        if key not in consumed and not any(key.endswith(s) for s in IGNORED_SUFFIXES)
    }
    if unused and strict:
        raise ValueError(
            f"The checkpoint has tensors the model does not use: {_listed(unused)}. "
            "Pass strict=False to drop them (e.g. a pretraining or classification head)."
        )


def save_pretrained(
    model: Any,
    folder: str | os.PathLike[str],
    tokenizer: Any = None,
    model_type: str | None = None,
    max_shard_size: int | None = None,
) -> None:
    """Writes `model` as a Hugging Face folder: `config.json`, `model.safetensors` (or shards
    and their index) and, with a `WordPieceTokenizer`, `vocab.txt` and
    `tokenizer_config.json`.

    Args:
        model: an `EncoderBackbone` (written as BERT, RoBERTa or DistilBERT, inferred from
            its arguments) or a `DecoderBackbone` (GPT-2; rotary ones Llama or Qwen2), or a
            task holding one (its `backbone` is written; a head's own layers are not).
        folder: path; created if needed, files in it overwritten.
        tokenizer: optional `WordPieceTokenizer`.
        model_type: optional `"bert"`, `"roberta"`, `"distilbert"`, `"gpt2"`, `"llama"`,
            `"mistral"` or `"qwen2"`.
        max_shard_size: optional int, bytes: past it the weights are split into
            `model-0000k-of-0000n.safetensors` files listed in `model.safetensors.index.json`,
            as `transformers` writes them (each shard holds whole tensors).
    Raises:
        ValueError: the model has an argument the layout cannot express (naming it).
    """
    from keras_attn.pretrained.folder import check_shard_size, write_folder

    check_shard_size(max_shard_size)
    model = getattr(model, "backbone", model)
    architecture, model_type = layout_for_model(model, model_type)
    config = architecture.hf_config(model, model_type)
    tensors = architecture.tensors(model)
    stored: dict[str, np.ndarray]
    fused: dict[str, list[Any]]
    stored, fused = {}, {}
    for variable in model.weights:
        entry = tensors[variable.path]
        value = entry.to_stored(keras.ops.convert_to_numpy(variable))
        if entry.parts > 1:
            fused.setdefault(entry.key, [None] * entry.parts)[entry.part] = (entry, value)
        else:
            stored[entry.key] = value
    for key, pieces in fused.items():
        stored[key] = np.concatenate([v for _, v in pieces], axis=0 if pieces[0][0].linear else -1)
    stored = {architecture.stored_key(key): value for key, value in stored.items()}
    vocabulary, extra = None, {}
    if tokenizer is not None:
        vocabulary = tokenizer.get_vocabulary()
        extra["tokenizer_config.json"] = {
            "do_lower_case": bool(tokenizer.lowercase),
            "tokenizer_class": "BertTokenizer",
        }
    write_folder(
        folder, config, stored, vocabulary=vocabulary, extra_json=extra,
        max_shard_size=max_shard_size,
    )  # fmt: skip
