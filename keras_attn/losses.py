"""Losses for token-level and sequence-level training."""

from typing import Any

import keras
from keras import ops


def scale_for_replicas(loss: Any) -> Any:
    """Divides a per-replica mean by the replica count under `tf.distribute`, as Keras's own
    losses do, so that summed replica gradients equal the gradient of the global mean."""
    if keras.backend.backend() != "tensorflow":
        return loss
    import tensorflow as tf

    replicas = tf.distribute.get_strategy().num_replicas_in_sync
    return loss if replicas == 1 else loss / replicas


@keras.saving.register_keras_serializable(package="keras_attn")
class SparseCrossEntropy(keras.losses.Loss):
    """Sparse categorical cross-entropy with an ignore label and label smoothing.

    With `label_smoothing=ε` the target is `(1 - ε)·one_hot(y) + ε/C` over the `C` classes, so
    the loss is `(1 - ε)·(-log p_y) + ε·mean_c(-log p_c)` (Szegedy et al.; Keras's
    `CategoricalCrossentropy(label_smoothing=ε)` gives the same value from one-hot labels).
    Targets equal to `ignore_class` contribute nothing and are not counted: the loss is the
    mean over the other targets (times `sample_weight` when given). Padding is expressed by
    the ignore label, so the Keras mask of `y_pred` is not consulted.

    Args:
        from_logits: bool. `y_pred` are logits (default) or probabilities.
        ignore_class: optional int. Target id to skip (padding, sub-word continuations).
        label_smoothing: float in [0, 1). Defaults to `0.0`.
    Example:
        >>> loss = SparseCrossEntropy(ignore_class=0, label_smoothing=0.1)
        >>> float(loss([[2, 0]], [[[0.0, 1.0, 2.0], [5.0, 0.0, 0.0]]]))  # second target ignored
        0.508
    """

    def __init__(
        self,
        from_logits: bool = True,
        ignore_class: int | None = None,
        label_smoothing: float = 0.0,
        name: str = "sparse_cross_entropy",
        **kwargs: Any,
    ) -> None:
        super().__init__(name=name, **kwargs)
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(
                f"`label_smoothing` must be in [0, 1). Received: label_smoothing={label_smoothing}"
            )
        if ignore_class is not None and (
            not isinstance(ignore_class, int) or isinstance(ignore_class, bool)
        ):
            raise ValueError(
                f"`ignore_class` must be an int or None. Received: ignore_class={ignore_class!r}"
            )
        self.from_logits = from_logits
        self.ignore_class = ignore_class
        self.label_smoothing = label_smoothing

    def _labels(self, y_true, y_pred):
        y_true = ops.cast(ops.convert_to_tensor(y_true), "int32")
        if len(y_true.shape) == len(y_pred.shape):  # labels with a trailing axis of 1
            y_true = ops.squeeze(y_true, -1)
        valid = (
            ops.ones_like(y_true, dtype="bool")
            if self.ignore_class is None
            else ops.not_equal(y_true, self.ignore_class)
        )
        return ops.where(valid, y_true, 0), valid

    def call(self, y_true: Any, y_pred: Any) -> Any:
        """Per-target losses, zero where the target is ignored."""
        labels, valid = self._labels(y_true, y_pred)
        return self._per_target(labels, valid, y_pred)

    def _per_target(self, labels, valid, y_pred):
        y_pred = ops.cast(y_pred, "float32")
        if self.from_logits:
            log_probs = ops.log_softmax(y_pred, axis=-1)
        else:
            log_probs = ops.log(ops.clip(y_pred, 1e-7, 1.0))
        nll = -ops.squeeze(ops.take_along_axis(log_probs, labels[..., None], axis=-1), -1)
        if self.label_smoothing:
            smooth = -ops.mean(log_probs, axis=-1)
            nll = (1.0 - self.label_smoothing) * nll + self.label_smoothing * smooth
        return ops.where(valid, nll, 0.0)

    def __call__(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> Any:
        y_pred = ops.convert_to_tensor(y_pred)
        labels, valid = self._labels(y_true, y_pred)
        losses = self._per_target(labels, valid, y_pred)
        valid = ops.cast(valid, "float32")
        weights = valid
        if sample_weight is not None:
            sample_weight = ops.cast(sample_weight, "float32")
            while len(sample_weight.shape) < len(losses.shape):
                sample_weight = ops.expand_dims(sample_weight, -1)
            weights = weights * sample_weight
        loss = ops.sum(losses * weights) / ops.maximum(ops.sum(valid), 1.0)
        return scale_for_replicas(loss)

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "from_logits": self.from_logits,
            "ignore_class": self.ignore_class,
            "label_smoothing": self.label_smoothing,
        }
