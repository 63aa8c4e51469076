"""LoRA (Hu et al.): low-rank adapters on a backbone's projections, the rest frozen.

`backbone.enable_lora(rank)` calls Keras's own `Dense.enable_lora` / `EinsumDense.enable_lora`
on the projections named in `target` (by default the attention's query and value, as
keras-hub): each keeps its kernel frozen and learns `W + (alpha / rank) · A·B`. Every other
weight of the backbone stops training (a task's own head keeps training). The adapters alone
are saved and loaded (`save_lora_weights`, a safetensors file), the backbone's config records
them so a `.keras` file reloads with them, and `merged_copy` folds them into the kernels for
export.
"""

import json
import os
from typing import Any

import keras
import numpy as np

DEFAULT_TARGET = ("query", "value")
PROJECTIONS = ("query", "key", "value", "attention_output", "intermediate", "gate", "output")


def _projections(model: keras.Model) -> list[keras.layers.Layer]:
    """The model's `Dense`/`EinsumDense` layers named as projections (`PROJECTIONS`)."""
    return [
        layer for layer in model._flatten_layers(include_self=False)
        if isinstance(layer, (keras.layers.Dense, keras.layers.EinsumDense))
        and layer.name in PROJECTIONS
    ]  # fmt: skip


def lora_layers(model: keras.Model) -> list[keras.layers.Layer]:
    """The layers of `model` with adapters, in graph order."""
    return [
        layer for layer in model._flatten_layers(include_self=False)
        if getattr(layer, "lora_enabled", False)
    ]  # fmt: skip


def enable_lora(
    model: keras.Model, rank: int, target: Any = DEFAULT_TARGET, alpha: float | None = None
) -> None:
    """Adapters of `rank` on `model`'s projections named in `target`; every other weight of
    `model` frozen (see the module docstring)."""
    if isinstance(rank, bool) or not isinstance(rank, int) or rank <= 0:
        raise ValueError(f"`rank` must be a positive integer. Received: rank={rank!r}")
    target = (target,) if isinstance(target, str) else tuple(target)
    unknown = sorted(set(target) - set(PROJECTIONS))
    if not target or unknown:
        raise ValueError(
            f"`target` names projections among {list(PROJECTIONS)}. Received: target={target}"
        )
    if alpha is not None and not alpha > 0:
        raise ValueError(f"`alpha` must be positive. Received: alpha={alpha!r}")
    if lora_layers(model):
        raise ValueError(f"LoRA is already enabled on {model.name!r}; it can be enabled once.")
    chosen = _targets(model, target)
    model.trainable = True
    for layer in _leaves(model):
        layer.trainable = False
    for layer in chosen:
        layer.trainable = True
        layer.enable_lora(rank, lora_alpha=alpha)
        if layer.bias is not None:
            layer.bias.trainable = False  # only the adapters train
    model._keras_attn_lora = {"rank": rank, "target": list(target), "alpha": chosen[0].lora_alpha}


def _targets(model: keras.Model, target: tuple[str, ...]) -> list[keras.layers.Layer]:
    chosen = [layer for layer in _projections(model) if layer.name in target]
    if not chosen:
        raise ValueError(f"{model.name!r} has no projection named in target={target}.")
    return chosen


def lora_config(model: keras.Model) -> dict[str, Any] | None:
    return getattr(model, "_keras_attn_lora", None)


def save_lora_weights(model: keras.Model, path: str | os.PathLike[str]) -> None:
    """The adapters (`lora_kernel_a`, `lora_kernel_b` of each layer, keyed by its path) and
    their rank, target and alpha, as one safetensors file."""
    from safetensors.numpy import save_file

    config = lora_config(model)
    if config is None:
        raise ValueError(f"{model.name!r} has no LoRA adapters: call enable_lora(rank) first.")
    tensors = {}
    for layer in lora_layers(model):
        tensors[f"{layer.path}/lora_kernel_a"] = np.asarray(layer.lora_kernel_a)
        tensors[f"{layer.path}/lora_kernel_b"] = np.asarray(layer.lora_kernel_b)
    save_file(tensors, os.fspath(path), metadata={"keras_attn_lora": json.dumps(config)})


def load_lora_weights(model: keras.Model, path: str | os.PathLike[str]) -> None:
    """Adapters saved by `save_lora_weights` into `model` (enabling LoRA with the saved rank,
    target and alpha when it is not enabled yet)."""
    from safetensors import safe_open

    name = os.path.basename(os.fspath(path))
    try:
        with safe_open(os.fspath(path), framework="numpy") as f:
            metadata = f.metadata() or {}
            tensors = {key: f.get_tensor(key) for key in f.keys()}
    except FileNotFoundError:
        raise ValueError(f"`path` does not exist. Received: path={os.fspath(path)!r}") from None
    except Exception as error:  # SafetensorError, or an OSError from a file cut short
        raise ValueError(f"{name} is not a valid safetensors file: {error}") from None
    if "keras_attn_lora" not in metadata:
        raise ValueError(f"`path` is not a LoRA file of ours. Received: path={os.fspath(path)!r}")
    try:
        saved = json.loads(metadata["keras_attn_lora"])
        saved = {k: saved[k] for k in ("rank", "target", "alpha")}
    except (ValueError, TypeError, KeyError):
        raise ValueError(
            f"{name}'s LoRA settings are not valid: {metadata['keras_attn_lora']!r}"
        ) from None
    for key, value in tensors.items():
        if value.dtype.kind != "f":
            raise ValueError(
                f"{name}: adapter {key} must be floating point. Received: {value.dtype}"
            )
    if lora_config(model) not in (None, saved):
        raise ValueError(
            f"The file's adapters ({saved}) differ from the model's ({lora_config(model)})."
        )
    # Everything is checked before LoRA is enabled: a refused file leaves the model as it was.
    layers = {layer.path: layer for layer in _targets(model, tuple(saved["target"]))}
    expected = {f"{p}/lora_kernel_{ab}" for p in layers for ab in "ab"}
    if set(tensors) != expected:
        raise ValueError(
            "The file's adapters are for other layers. Missing: "
            f"{sorted(expected - set(tensors))[:4]}; unknown: {sorted(set(tensors) - expected)[:4]}"
        )
    rank = saved["rank"]
    for layer_path, layer in layers.items():
        kernel = tuple(layer.kernel.shape)
        shapes = {"a": (*kernel[:-1], rank), "b": (rank, kernel[-1])}
        for ab, shape in shapes.items():
            value = tensors[f"{layer_path}/lora_kernel_{ab}"]
            if tuple(value.shape) != shape:
                raise ValueError(
                    f"Adapter {layer_path}/lora_kernel_{ab} has shape {value.shape}; the model's "
                    f"adapters of rank {rank} are {shape}."
                )
    if lora_config(model) is None:
        enable_lora(model, rank, saved["target"], saved["alpha"])
    for layer_path, layer in layers.items():
        for ab in "ab":
            getattr(layer, f"lora_kernel_{ab}").assign(tensors[f"{layer_path}/lora_kernel_{ab}"])


def merged_copy(model: keras.Model) -> keras.Model:
    """A copy of `model` without adapters, each adapted kernel replaced by `W + (alpha /
    rank) · A·B`: what is exported. `model` itself is unchanged."""
    adapted = {layer.path: layer for layer in lora_layers(model)}
    if any(layer.quantization_mode for layer in adapted.values()):
        raise ValueError("Merging adapters into quantized kernels is not supported.")
    config = keras.saving.serialize_keras_object(model)
    copy = keras.saving.deserialize_keras_object(_without_lora(config))
    theirs = {layer.path: layer for layer in _leaves(copy)}
    for layer in _leaves(model):
        twin = theirs[layer.path]
        if layer.path in adapted:  # the merged kernel, then the bias
            weights = [layer.kernel] + ([layer.bias] if layer.bias is not None else [])
        else:
            weights = layer.weights
        for a, b in zip(weights, twin.weights, strict=True):
            b.assign(keras.ops.convert_to_numpy(a))
    return copy


def _leaves(model: keras.Model) -> list[keras.layers.Layer]:
    """Layers without sublayers (they own every variable)."""
    return [
        layer for layer in model._flatten_layers(include_self=False)
        if not list(layer._flatten_layers(include_self=False))
    ]  # fmt: skip


def _without_lora(value: Any) -> Any:
    """A serialized model config with every `lora` record dropped."""
    if isinstance(value, dict):
        return {k: _without_lora(v) for k, v in value.items() if k != "lora"}
    if isinstance(value, list):
        return [_without_lora(v) for v in value]
    return value
