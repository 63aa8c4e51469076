"""Keras-native quantization (`model.quantize("int8")`, `"float8"`) made atomic and saved.

Keras quantizes leaf layers one by one, so a layer it cannot quantize half-way through leaves
the model part quantized; and our backbones are rebuilt from their constructor arguments on
load, which makes float layers that cannot take the saved int8 kernels. `quantize` here checks
every layer first, then quantizes; the paths of the quantized layers go into the model's
config, and loading quantizes those same layers again before the saved weights are read in.
"""

import re
from collections.abc import Callable
from typing import Any

import keras

CONFIG_KEY = "quantized_layers"


def _leaves(model: keras.Model) -> list[keras.layers.Layer]:
    """The layers Keras's `quantize` calls: those without sublayers."""
    return [layer for layer in model._flatten_layers() if len(list(layer._flatten_layers())) == 1]


def quantize(model: keras.Model, keras_quantize: Callable[..., None], mode: Any = None,
             config: Any = None, filters: Any = None, **kwargs: Any) -> None:  # fmt: skip
    """Checks, then runs `keras_quantize` (Keras's `Model.quantize`), then records what it
    quantized on `model` for `get_config`. Raises before any change when a layer it would
    reach is not built or no layer would be quantized (Keras itself refuses an unknown
    `mode` before calling this)."""
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
        and layer.quantization_mode is None
    ]  # fmt: skip
    if not quantizable:
        raise ValueError(
            f"No layer of {model.name!r} can be quantized (Dense, EinsumDense, Embedding not "
            f"yet quantized). Received: filters={filters!r}"
        )
    keras_quantize(mode, config=config, filters=filters, **kwargs)
    model._keras_attn_quantized = quantized_layers(model)


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


def quantized_layers(model: keras.Model) -> dict[str, str]:
    """`{layer path: quantization mode}` of the model's quantized layers."""
    return {
        layer.path: layer.quantization_mode
        for layer in _leaves(model)
        if getattr(layer, "quantization_mode", None)
    }


def requantize(model: keras.Model, layers: dict[str, str]) -> None:
    """Quantizes the layers at `layers`' paths (a fresh model being loaded), so the saved
    quantized variables have their places."""
    found = {layer.path: layer for layer in _leaves(model)}
    missing = sorted(set(layers) - set(found))
    if missing:
        raise ValueError(
            f"The config lists quantized layers the model does not have: {missing[:8]}"
        )
    for path, mode in layers.items():
        found[path].quantize(mode)
    model._keras_attn_quantized = dict(layers)
