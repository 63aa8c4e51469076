"""BERT's masked-LM corruption: choose 15% of tokens; of those 80% [MASK], 10% random, 10% kept."""

from collections.abc import Iterable
from typing import Any

import keras
import tensorflow as tf
import tensorflow_text as tf_text

from keras_attn.checks import check_positive_int
from keras_attn.preprocessing.base import PreprocessingLayer, to_ragged
from keras_attn.types import Tensor


@keras.saving.register_keras_serializable(package="keras_attn")
class MaskedLMMaskGenerator(PreprocessingLayer):
    """Corrupts token ids for masked-LM training and says what to predict where.

    Each real, non-special token is selected with probability `mask_selection_rate` (at most
    `mask_selection_length` per sequence); a selected token becomes `mask_token_id` with
    probability `mask_token_rate`, a random id with `random_token_rate`, and stays itself
    otherwise. Built on tensorflow-text's `mask_language_model`; draws come from TensorFlow's
    random ops, reproducible after `keras.utils.set_random_seed`.

    Args:
        vocabulary_size: int. Random replacements are drawn from `[0, vocabulary_size)`
            (excluding `unselectable_token_ids`).
        mask_token_id: int. The `[MASK]` id.
        mask_selection_length: int. Predictions per sequence (outputs are padded to it).
        mask_selection_rate: float. Defaults to `0.15`.
        mask_token_rate, random_token_rate: floats. Default to `0.8` and `0.1`.
        unselectable_token_ids: ids never selected; defaults to `[0]` (padding). Pass every
            special token id.
    Call arguments:
        inputs: int ids `(batch, None)` ragged, or dense `(batch, L)` padded with 0.
    Returns:
        dict: `token_ids` (corrupted, same shape and kind as inputs), `mask_positions`,
        `mask_ids` (the original ids there) and `mask_weights` (1.0 where a prediction is due),
        each `(batch, mask_selection_length)`.
    """

    def __init__(
        self,
        vocabulary_size: int,
        mask_token_id: int,
        mask_selection_length: int,
        mask_selection_rate: float = 0.15,
        mask_token_rate: float = 0.8,
        random_token_rate: float = 0.1,
        unselectable_token_ids: Iterable[int] = (0,),
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        check_positive_int("vocabulary_size", vocabulary_size)
        check_positive_int("mask_selection_length", mask_selection_length)
        if not 0 <= mask_token_id < vocabulary_size:
            raise ValueError(
                f"`mask_token_id` must be in [0, vocabulary_size={vocabulary_size}). "
                f"Received: mask_token_id={mask_token_id}"
            )
        for name, rate in (
            ("mask_selection_rate", mask_selection_rate),
            ("mask_token_rate", mask_token_rate),
            ("random_token_rate", random_token_rate),
        ):
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"`{name}` must be in [0, 1]. Received: {name}={rate}")
        if mask_token_rate + random_token_rate > 1.0:
            raise ValueError(
                "`mask_token_rate + random_token_rate` must be at most 1. Received: "
                f"{mask_token_rate} + {random_token_rate}"
            )
        self.vocabulary_size = vocabulary_size
        self.mask_token_id = mask_token_id
        self.mask_selection_length = mask_selection_length
        self.mask_selection_rate = mask_selection_rate
        self.mask_token_rate = mask_token_rate
        self.random_token_rate = random_token_rate
        self.unselectable_token_ids = [int(i) for i in unselectable_token_ids]

    def call(self, inputs: list[Any] | Tensor | tf.RaggedTensor) -> dict[str, tf.Tensor]:
        dense = not isinstance(inputs, tf.RaggedTensor)
        ids, single = to_ragged(inputs)
        if dense:  # padding (0) is not a token: drop it, restore the dense shape at the end
            width = tf.shape(tf.convert_to_tensor(inputs))[-1]
            ids = tf.ragged.boolean_mask(ids, ids != 0)
        selector = tf_text.RandomItemSelector(
            max_selections_per_batch=self.mask_selection_length,
            selection_rate=self.mask_selection_rate,
            unselectable_ids=self.unselectable_token_ids,
        )
        chooser = tf_text.MaskValuesChooser(
            self.vocabulary_size,
            self.mask_token_id,
            mask_token_rate=self.mask_token_rate,
            random_token_rate=self.random_token_rate,
        )
        masked, positions, mask_ids = tf_text.mask_language_model(ids, selector, chooser)
        positions, weights = tf_text.pad_model_inputs(positions, self.mask_selection_length)
        mask_ids, _ = tf_text.pad_model_inputs(mask_ids, self.mask_selection_length)
        masked = tf.cast(masked, tf.int32)
        if dense:
            masked = masked.to_tensor(default_value=0, shape=[None, width])
        out = {
            "token_ids": masked,
            "mask_positions": tf.cast(positions, tf.int32),
            "mask_ids": tf.cast(mask_ids, tf.int32),
            "mask_weights": tf.cast(weights, tf.float32),
        }
        if single:
            out = {k: v[0] for k, v in out.items()}
        return out

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "vocabulary_size": self.vocabulary_size,
            "mask_token_id": self.mask_token_id,
            "mask_selection_length": self.mask_selection_length,
            "mask_selection_rate": self.mask_selection_rate,
            "mask_token_rate": self.mask_token_rate,
            "random_token_rate": self.random_token_rate,
            "unselectable_token_ids": self.unselectable_token_ids,
        }
