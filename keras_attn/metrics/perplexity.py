"""Perplexity: exp of the mean next-token cross-entropy over real (non-padding) tokens."""

from typing import Any

import keras
from keras import ops

from keras_attn.types import Tensor


@keras.saving.register_keras_serializable(package="keras_attn")
class Perplexity(keras.metrics.Metric):
    """`exp(Σ CE · w / Σ w)` over tokens whose target is not `mask_token_id`.

    Args:
        from_logits: bool. `y_pred` are logits (default) or probabilities.
        mask_token_id: optional int. Targets equal to it (padding) are left out. Defaults to 0.
    """

    def __init__(
        self,
        from_logits: bool = True,
        mask_token_id: int | None = 0,
        name: str = "perplexity",
        **kwargs: Any,
    ) -> None:
        super().__init__(name=name, **kwargs)
        self.from_logits = from_logits
        self.mask_token_id = mask_token_id
        self.total = self.add_variable(shape=(), initializer="zeros", name="total")
        self.count = self.add_variable(shape=(), initializer="zeros", name="count")

    def update_state(
        self, y_true: Tensor, y_pred: Tensor, sample_weight: Tensor | None = None
    ) -> None:
        y_true = ops.cast(y_true, "int32")
        ce = keras.losses.sparse_categorical_crossentropy(
            y_true, ops.cast(y_pred, "float32"), from_logits=self.from_logits
        )
        weight = ops.ones_like(ce)
        if self.mask_token_id is not None:
            weight = ops.cast(ops.not_equal(y_true, self.mask_token_id), "float32")
        if sample_weight is not None:
            weight = weight * ops.cast(sample_weight, "float32")
        self.total.assign_add(ops.sum(ce * weight))
        self.count.assign_add(ops.sum(weight))

    def result(self) -> Tensor:
        return ops.exp(ops.divide_no_nan(self.total, self.count))

    def reset_state(self) -> None:
        self.total.assign(0.0)
        self.count.assign(0.0)

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "from_logits": self.from_logits,
            "mask_token_id": self.mask_token_id,
        }
