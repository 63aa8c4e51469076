"""Learning-rate schedules and the AdamW setup Transformers are usually trained with."""

import math
from typing import Any

import keras
from keras import ops

from keras_attn.checks import check_choice, check_positive_int


@keras.saving.register_keras_serializable(package="keras_attn")
class InverseSqrtSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Vaswani et al.'s schedule: `scale · d^-0.5 · min(s^-0.5, s · warmup^-1.5)`.

    `s` is the 1-based step (`optimizer.iterations + 1`): linear warmup for `warmup_steps`,
    then decay with the inverse square root of the step. The peak, at `s = warmup_steps`, is
    `scale / sqrt(hidden_dim · warmup_steps)`.

    Args:
        hidden_dim: int. Model width `d`.
        warmup_steps: int. Defaults to `4000` (the paper's).
        scale: float. Multiplies the whole schedule. Defaults to `1.0`.
    """

    def __init__(self, hidden_dim: int, warmup_steps: int = 4000, scale: float = 1.0) -> None:
        check_positive_int("hidden_dim", hidden_dim)
        check_positive_int("warmup_steps", warmup_steps)
        self.hidden_dim = hidden_dim
        self.warmup_steps = warmup_steps
        self.scale = scale

    def __call__(self, step: Any) -> Any:
        s = ops.cast(step, "float32") + 1.0
        warmup = ops.cast(self.warmup_steps, "float32")
        rate = ops.minimum(ops.rsqrt(s), s * warmup**-1.5)
        return self.scale * self.hidden_dim**-0.5 * rate

    def get_config(self) -> dict[str, Any]:
        return {
            "hidden_dim": self.hidden_dim,
            "warmup_steps": self.warmup_steps,
            "scale": self.scale,
        }


@keras.saving.register_keras_serializable(package="keras_attn")
class WarmupDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup from 0 to `peak_learning_rate`, then linear or cosine decay.

    At step `s` (`optimizer.iterations`, 0-based): `peak · s / warmup_steps` while
    `s < warmup_steps`; then with `p = (s - warmup_steps) / (total_steps - warmup_steps)`
    clipped to [0, 1], `final + (peak - final) · (1 - p)` (linear, BERT) or
    `final + (peak - final) · (1 + cos(π p)) / 2` (cosine).

    Args:
        peak_learning_rate: float.
        warmup_steps: int ≥ 0.
        total_steps: int > warmup_steps.
        decay: `"linear"` or `"cosine"`. Defaults to `"linear"`.
        final_learning_rate: float. Defaults to `0.0`.
    """

    def __init__(
        self,
        peak_learning_rate: float,
        warmup_steps: int,
        total_steps: int,
        decay: str = "linear",
        final_learning_rate: float = 0.0,
    ) -> None:
        if not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise ValueError(
                "`warmup_steps` must be a non-negative int. "
                f"Received: warmup_steps={warmup_steps!r}"
            )
        if not isinstance(total_steps, int) or total_steps <= warmup_steps:
            raise ValueError(
                f"`total_steps` must be an int larger than warmup_steps={warmup_steps}. "
                f"Received: total_steps={total_steps!r}"
            )
        check_choice("decay", decay, ("linear", "cosine"))
        self.peak_learning_rate = peak_learning_rate
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps
        self.decay = decay
        self.final_learning_rate = final_learning_rate

    def __call__(self, step: Any) -> Any:
        s = ops.cast(step, "float32")
        peak, final = self.peak_learning_rate, self.final_learning_rate
        warmup = peak * s / max(self.warmup_steps, 1)
        p = ops.clip((s - self.warmup_steps) / (self.total_steps - self.warmup_steps), 0.0, 1.0)
        if self.decay == "linear":
            decayed = final + (peak - final) * (1.0 - p)
        else:
            decayed = final + (peak - final) * 0.5 * (1.0 + ops.cos(math.pi * p))
        return ops.where(s < self.warmup_steps, warmup, decayed)

    def get_config(self) -> dict[str, Any]:
        return {
            "peak_learning_rate": self.peak_learning_rate,
            "warmup_steps": self.warmup_steps,
            "total_steps": self.total_steps,
            "decay": self.decay,
            "final_learning_rate": self.final_learning_rate,
        }


NO_DECAY = ("bias", "gamma", "beta")


def adamw(
    learning_rate: float | keras.optimizers.schedules.LearningRateSchedule = 1e-3,
    weight_decay: float = 0.01,
    global_clipnorm: float | None = 1.0,
    **kwargs: Any,
) -> keras.optimizers.AdamW:
    """`keras.optimizers.AdamW` set up as BERT and GPT-2 train: decoupled weight decay on
    kernels and embeddings but not on biases or LayerNorm scales/offsets, and gradients
    clipped to a global norm (`None` turns clipping off).

    Args:
        learning_rate: float or a schedule (`WarmupDecay`, `InverseSqrtSchedule`).
        weight_decay: float. Defaults to `0.01`.
        global_clipnorm: optional float. Defaults to `1.0`.
        **kwargs: passed to `keras.optimizers.AdamW` (`beta_1`, `epsilon`, ...).
    """
    optimizer = keras.optimizers.AdamW(
        learning_rate=learning_rate,
        weight_decay=weight_decay,
        global_clipnorm=global_clipnorm,
        **kwargs,
    )
    optimizer.exclude_from_weight_decay(var_names=list(NO_DECAY))
    return optimizer
