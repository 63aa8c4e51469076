"""Masked token accuracy: the share of real targets predicted right, padding skipped."""

from typing import Any

import keras
from keras import ops

from keras_attn.types import Tensor


@keras.saving.register_keras_serializable(package="keras_attn")
class MaskedAccuracy(keras.metrics.Mean):
    """Accuracy of `argmax(y_pred)` over targets not equal to `ignore_class` (masked-LM
    predictions, tags of real tokens).

    Args:
        ignore_class: int. Target id to skip. Defaults to `0` (padding).
    Example:
        >>> metric = MaskedAccuracy()
        >>> logits = ops.array([[[0, 0, 0, 1.0], [0, 0, 1.0, 0], [1.0, 0, 0, 0]]])  # 3, 2, 0
        >>> metric.update_state(ops.array([[3, 1, 0]]), logits)  # the 0 target is not counted
        >>> float(metric.result())
        0.5
    """

    def __init__(self, ignore_class: int = 0, name: str = "masked_accuracy", **kwargs: Any) -> None:
        super().__init__(name=name, **kwargs)
        self.ignore_class = ignore_class

    def update_state(
        self, y_true: Tensor, y_pred: Tensor, sample_weight: Tensor | None = None
    ) -> None:
        y_true = ops.cast(y_true, "int32")
        if len(y_true.shape) == len(y_pred.shape):
            y_true = ops.squeeze(y_true, -1)
        correct = ops.cast(ops.equal(ops.argmax(y_pred, axis=-1), y_true), self.dtype)
        weight = ops.cast(ops.not_equal(y_true, self.ignore_class), self.dtype)
        if sample_weight is not None:
            sample_weight = ops.cast(sample_weight, self.dtype)
            while len(sample_weight.shape) < len(weight.shape):
                sample_weight = ops.expand_dims(sample_weight, -1)
            weight = weight * sample_weight
        super().update_state(correct, sample_weight=weight)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "ignore_class": self.ignore_class}
