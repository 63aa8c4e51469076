"""Keras-native quantization (`model.quantize("int8")`, `"float8"`, `"int4"`) made atomic
and saved.

Keras quantizes leaf layers one by one, so a layer it cannot quantize half-way through leaves
the model part quantized; and our backbones are rebuilt from their constructor arguments on
load, which makes float layers that cannot take the saved int8 kernels. `quantize` here checks
every layer first, then quantizes; each model's config lists its quantized layers (path, mode
and quantization config, read from the layers themselves, so a backbone saved alone or inside
any model keeps its own), and loading quantizes those same layers again before the saved
weights are read in.
"""

import re
from collections.abc import Callable
from typing import Any

import keras

UNSAVED_MODES = ("gptq", "awq")  # calibrated: not replayable from a config


def _leaves(model: keras.Model) -> list[keras.layers.Layer]:
    """The layers Keras's `quantize` calls: those without sublayers."""
    return [layer for layer in model._flatten_layers() if len(list(layer._flatten_layers())) == 1]


def _selected(layer: keras.layers.Layer, filters: Any) -> bool:
    """Keras's `filters` rule: a regex (or regexes) searched in the layer's name, or a
    callable of the layer."""
    if filters is None:
        return True
    if isinstance(filters, str):
        return bool(re.search(filters, layer.name))
    if isinstance(filters, (list, tuple)):
        return any(re.search(pattern, layer.name) for pattern in filters)
    return bool(filters(layer)) if callable(filters) else True


def quantize(model: keras.Model, keras_quantize: Callable[..., None], mode: Any = None,
             config: Any = None, filters: Any = None, **kwargs: Any) -> None:  # fmt: skip
    """Checks, then runs `keras_quantize` (Keras's `Model.quantize`) on the selected layers
    not quantized yet. Raises before any change for GPTQ/AWQ (calibrated: they could not be
    reloaded), an unbuilt layer, or nothing left to quantize (Keras itself refuses an unknown
    `mode` before calling this)."""
    if mode in UNSAVED_MODES:
        raise ValueError(
            f"`mode` {mode!r} needs calibration and cannot be saved with our models; use "
            f"'int8', 'float8' or 'int4'. Received: mode={mode!r}"
        )
    chosen = [layer for layer in _leaves(model) if _selected(layer, filters)]
    unbuilt = [layer.path or layer.name for layer in chosen if not layer.built]
    if unbuilt:
        raise ValueError(
            f"Every layer must be built before quantizing; nothing was changed. Not built: "
            f"{unbuilt[:8]}"
        )
    quantizable = [
        layer for layer in chosen
        if isinstance(layer, (keras.layers.Dense, keras.layers.EinsumDense,
                              keras.layers.Embedding))
        and not layer.quantization_mode
    ]  # fmt: skip
    if not quantizable:
        raise ValueError(
            f"No layer of {model.name!r} is left to quantize (Dense, EinsumDense, Embedding "
            f"not quantized yet). Received: filters={filters!r}"
        )

    def fresh(layer: keras.layers.Layer) -> bool:  # Keras would refuse a quantized one midway
        return _selected(layer, filters) and not getattr(layer, "quantization_mode", None)

    keras_quantize(mode, config=config, filters=fresh, **kwargs)


def quantized_layers(model: keras.Model, nested: list[keras.Model]) -> dict[str, Any]:
    """`{layer path: {"mode", "config"}}` of the model's quantized layers, leaving out those
    of the `nested` models (which record their own)."""
    inner = {id(layer) for other in nested for layer in other._flatten_layers()}
    record = {}
    for layer in _leaves(model):
        mode = getattr(layer, "quantization_mode", None)
        if mode and id(layer) not in inner:
            config = getattr(layer, "quantization_config", None)
            serialized = None if config is None else keras.saving.serialize_keras_object(config)
            record[layer.path] = {"mode": mode, "config": serialized}
    return record


def requantize(model: keras.Model, layers: dict[str, Any]) -> None:
    """Quantizes the layers at `layers`' paths as recorded (a fresh model being loaded), so
    the saved quantized variables have their places."""
    found = {layer.path: layer for layer in _leaves(model)}
    missing = sorted(set(layers) - set(found))
    if missing:
        raise ValueError(
            f"The config's `quantized_layers` name layers {model.name!r} does not have: "
            f"{missing[:8]}"
        )
    for path, entry in layers.items():
        layer = found[path]
        if layer.quantization_mode:  # done by a nested model's own record
            continue
        config = entry.get("config")
        config = None if config is None else keras.saving.deserialize_keras_object(config)
        layer.quantize(entry["mode"], config=config)
