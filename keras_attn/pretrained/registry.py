"""The two registries of `keras_attn.pretrained`: checkpoint layouts by `model_type`, and the
model class each layout loads into (registered by the models themselves: this package sits
below `keras_attn.models` and never imports it).

A layout declares what it reads and writes (`Layout`); a family is added in its own module by
decorating its class with `@register_layout`.
"""

from typing import Any, ClassVar, Protocol

from keras_attn.pretrained.tensors import Tensor

MODEL_CLASSES: dict[str, type] = {}


def register_model_class(role: str, cls: type) -> type:
    """Registers `cls` as the class that checkpoints of `role` (`"EncoderBackbone"`,
    `"DecoderBackbone"`, `"Seq2SeqBackbone"`) load into; subclasses of it are accepted too."""
    MODEL_CLASSES[role] = cls
    return cls


def model_class(role: str) -> type:
    if role not in MODEL_CLASSES:
        raise ValueError(
            f"No model class is registered for {role!r} checkpoints (import keras_attn.models). "
            f"Registered: {sorted(MODEL_CLASSES)}"
        )
    return MODEL_CLASSES[role]


class Layout(Protocol):
    """One checkpoint layout: the `config.json` and tensor keys of a family of `model_type`s.

    Attributes:
        model_types: the `model_type`s it reads; the first is the one it writes by default.
        prefixes: key prefixes of task checkpoints stripped on reading (`bert.`).
        model_class: the registered role of the model it builds (`"EncoderBackbone"`).
        config_keys: `config.json` keys it reads (any other non-neutral key is refused).
        tied: `(key, source)` pairs: `key` may be stored as a copy of `source`.
        ignored: keys a checkpoint may hold that carry nothing the model reads (T5's unused
            cross-attention bias table).
    """

    model_types: ClassVar[tuple[str, ...]]
    prefixes: ClassVar[tuple[str, ...]]
    model_class: ClassVar[str]
    config_keys: ClassVar[tuple[str, ...]]
    tied: ClassVar[tuple[tuple[str, str], ...]]
    ignored: ClassVar[tuple[str, ...]]

    def model_kwargs(self, config: dict[str, Any], weights: dict[str, Any]) -> dict[str, Any]:
        """Our model's constructor arguments for `config.json` (and the checkpoint's keys)."""
        ...

    def expected_shapes(self, kwargs: dict[str, Any]) -> dict[str, tuple[int, ...]]:
        """Checkpoint tensors (key -> shape) that the sizes in `kwargs` imply."""
        ...

    def writes(self, model: Any) -> str | None:
        """The `model_type` to write `model` as when none is named, or None when this layout
        is not the one for it (at most one layout claims a model)."""
        ...

    def hf_config(self, model: Any, model_type: str) -> dict[str, Any]:
        """The `config.json` of `model` as `model_type`."""
        ...

    def tensors(self, model: Any) -> dict[str, Tensor]:
        """Our variable path -> how it is stored."""
        ...

    def stored_key(self, key: str) -> str:
        """The key written for `key` (a task prefix the reader strips, as `transformers`
        writes it)."""
        ...


class BaseLayout:
    """Defaults of the optional parts of `Layout`."""

    prefixes: ClassVar[tuple[str, ...]] = ()
    tied: ClassVar[tuple[tuple[str, str], ...]] = ()
    ignored: ClassVar[tuple[str, ...]] = ()

    def stored_key(self, key: str) -> str:
        return key


LAYOUTS: dict[str, Layout] = {}


def register_layout(cls: type) -> type:
    """Class decorator: registers an instance of `cls` under each of its `model_types`."""
    layout = cls()
    for model_type in cls.model_types:  # type: ignore[attr-defined]
        if model_type in LAYOUTS:
            raise ValueError(f"model_type {model_type!r} has a layout already.")
        LAYOUTS[model_type] = layout
    return cls


def layout_for_config(config: dict[str, Any]) -> Layout:
    """The layout of a `config.json`, by its `model_type`."""
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in LAYOUTS:
        raise ValueError(
            f"config.json's model_type is not supported. Received: model_type={model_type!r}; "
            f"supported: {sorted(LAYOUTS)}"
        )
    return LAYOUTS[model_type]


def layout_for_model(model: Any, model_type: str | None = None) -> tuple[Layout, str]:
    """The layout and `model_type` to write `model` in: `model_type` if given, else the one
    layout whose `writes(model)` holds."""
    if model_type is not None:
        layout = layout_for_config({"model_type": model_type})
    else:
        unique = {id(layout): layout for layout in LAYOUTS.values()}.values()
        found = [
            (layout, kind)
            for layout in unique
            if layout.model_class in MODEL_CLASSES
            and isinstance(model, MODEL_CLASSES[layout.model_class])
            and (kind := layout.writes(model)) is not None
        ]
        if len(found) != 1:
            raise ValueError(
                f"No single checkpoint layout writes this {type(model).__name__}; pass "
                f"model_type (one of {sorted(LAYOUTS)})."
            )
        layout, model_type = found[0]
    if not isinstance(model, model_class(layout.model_class)):
        raise ValueError(
            f"model_type {model_type!r} is a {layout.model_class}. "
            f"Received: a {type(model).__name__}"
        )
    return layout, model_type
