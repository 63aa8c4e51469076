"""T5's relative position bias: one learned score per head and distance bucket, added to the
attention scores instead of position vectors added to the embeddings (Raffel et al., 2020)."""

import math
from typing import Any

import keras
import numpy as np
from keras import ops

from keras_attn.checks import check_positive_ints
from keras_attn.layers.masks import per_row, row_positions
from keras_attn.types import Initializer, Shape, Tensor

# Far past T5's 128: a distance table of this size is small, and a larger one is a hostile
# or corrupt config (the table has one entry per distance).
MAX_DISTANCE = 1 << 16


def bucket_table(num_buckets: int, max_distance: int) -> np.ndarray:
    """Bucket of each distance `0 … max_distance` (larger distances share the last one).

    Distances below `num_buckets // 2` have a bucket each; the rest are spread
    logarithmically up to `max_distance`, as T5 computes them (in float32, truncated).
    """
    exact = num_buckets // 2
    distance = np.arange(max_distance + 1)
    with np.errstate(divide="ignore"):
        ratio = np.log(distance.astype(np.float32) / np.float32(exact))
    scaled = ratio / np.float32(math.log(max_distance / exact)) * np.float32(num_buckets - exact)
    large = exact + np.where(distance >= exact, scaled, 0).astype(np.int64)
    return np.where(distance < exact, distance, np.minimum(large, num_buckets - 1)).astype("int32")


@keras.saving.register_keras_serializable(package="keras_attn")
class RelativePositionBias(keras.layers.Layer):
    """An additive attention-score bias by relative position: `bias[h, i, j] = table[bucket(j -
    i), h]`, T5's position signal. Computed once per forward pass and passed to every block as
    `score_bias` (T5 keeps it in the first block and shares it).

    Buckets: bidirectional (an encoder) splits them between keys before and after the query;
    unidirectional (a causal decoder) buckets only keys before it. Within each half, the first
    half of the buckets are exact distances and the rest grow logarithmically up to
    `max_distance`, beyond which all distances share the last bucket.

    Args:
        num_heads: int. One bias per head.
        num_buckets: int. Defaults to `32`.
        max_distance: int. Defaults to `128`.
        bidirectional: bool. Defaults to `True`.
        embeddings_initializer: initializer of the `(num_buckets, num_heads)` table.
    Call arguments:
        inputs: `(batch, T, dim)`: the queries' sequence (only its length is read).
        key_length: optional int or scalar tensor: number of keys; defaults to `T`.
        start_index: int or scalar tensor: position of the first query (cached decoding);
            or a `(batch,)` tensor, one per row (rows at different lengths).
    Returns:
        float `(1, num_heads, T, key_length)` (`(batch, …)` with one `start_index` per row).
    Example:
        >>> bias = RelativePositionBias(num_heads=4)
        >>> tuple(bias(keras.random.normal((2, 5, 8))).shape)
        (1, 4, 5, 5)
    """

    def __init__(
        self,
        num_heads: int,
        num_buckets: int = 32,
        max_distance: int = 128,
        bidirectional: bool = True,
        embeddings_initializer: Initializer = "glorot_uniform",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        check_positive_ints(num_heads=num_heads, num_buckets=num_buckets, max_distance=max_distance)
        if max_distance > MAX_DISTANCE or num_buckets > MAX_DISTANCE:
            raise ValueError(
                f"`num_buckets` and `max_distance` must be at most {MAX_DISTANCE}. Received: "
                f"num_buckets={num_buckets}, max_distance={max_distance}"
            )
        half = num_buckets // 2 if bidirectional else num_buckets
        if half < 2 or max_distance <= half // 2:
            raise ValueError(
                "`max_distance` must exceed the exact buckets (num_buckets // 2, halved again "
                f"when bidirectional). Received: num_buckets={num_buckets}, "
                f"max_distance={max_distance}, bidirectional={bidirectional}"
            )
        self.num_heads = num_heads
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.bidirectional = bool(bidirectional)
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)
        self._table = bucket_table(half, max_distance)
        self.supports_masking = True  # the bias holds no padding; masks pass by it

    def compute_mask(self, inputs: Tensor, mask: Tensor | None = None) -> None:
        return None

    def build(self, inputs_shape: Shape | None = None) -> None:
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.num_buckets, self.num_heads),
            initializer=self.embeddings_initializer,
        )

    def buckets(self, query_length: Any, key_length: Any, start_index: Any = 0) -> Tensor:
        """Int `(T, S)` buckets of key position minus query position (`(B, T, S)` with one
        `start_index` per row)."""
        queries = row_positions(query_length, start_index)
        keys = ops.arange(key_length, dtype="int32")
        relative = keys - ops.expand_dims(queries, -1)
        table = ops.convert_to_tensor(self._table)
        if self.bidirectional:
            after = ops.cast(ops.greater(relative, 0), "int32") * (self.num_buckets // 2)
            distance = ops.minimum(ops.abs(relative), self.max_distance)
            return after + ops.take(table, distance, axis=0)
        distance = ops.minimum(ops.maximum(-relative, 0), self.max_distance)
        return ops.take(table, distance, axis=0)

    def call(self, inputs: Tensor, key_length: Any = None, start_index: int | Tensor = 0) -> Tensor:
        query_length = ops.shape(inputs)[1]
        key_length = query_length if key_length is None else key_length
        values = ops.take(
            ops.cast(self.embeddings, self.compute_dtype),
            self.buckets(query_length, key_length, start_index),
            axis=0,
        )  # ([B,] T, S, heads)
        if per_row(start_index):
            return ops.transpose(values, (0, 3, 1, 2))
        return ops.expand_dims(ops.transpose(values, (2, 0, 1)), 0)

    def compute_output_spec(
        self, inputs: Any, key_length: Any = None, start_index: Any = 0
    ) -> keras.KerasTensor:
        queries = inputs.shape[1]
        keys = queries if key_length is None else key_length
        keys = keys if isinstance(keys, int) else None
        batch = inputs.shape[0] if per_row(start_index) else 1
        return keras.KerasTensor((batch, self.num_heads, queries, keys), dtype=self.compute_dtype)

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "num_heads": self.num_heads,
            "num_buckets": self.num_buckets,
            "max_distance": self.max_distance,
            "bidirectional": self.bidirectional,
            "embeddings_initializer": keras.initializers.serialize(self.embeddings_initializer),
        }
