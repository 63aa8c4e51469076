"""Which of our model classes each checkpoint layout loads into, registered by the models
themselves: `keras_attn.pretrained` sits below `keras_attn.models` and never imports it."""

MODEL_CLASSES: dict[str, type] = {}


def register_model_class(role: str, cls: type) -> type:
    """Registers `cls` as the class that checkpoints of `role` (`"EncoderBackbone"`,
    `"DecoderBackbone"`)
    load into; subclasses of it are accepted too."""
    MODEL_CLASSES[role] = cls
    return cls


def model_class(role: str) -> type:
    if role not in MODEL_CLASSES:
        raise ValueError(
            f"No model class is registered for {role!r} checkpoints (import keras_attn.models). "
            f"Registered: {sorted(MODEL_CLASSES)}"
        )
    return MODEL_CLASSES[role]
