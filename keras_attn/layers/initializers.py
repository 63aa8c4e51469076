"""One initializer configuration, fresh random values for every weight it initializes."""

import keras

from keras_attn.types import Initializer


def fresh(initializer: Initializer) -> keras.initializers.Initializer:
    """A new instance of `initializer` (a name, config or instance).

    Keras 3 fixes an unseeded initializer's seed when the instance is made, so one instance
    used for several weights gives them identical values (W_q = W_k = W_v). Each weight gets
    its own instance instead, as `keras.layers.MultiHeadAttention` does; an explicitly seeded
    initializer stays reproducible.
    """
    initializer = keras.initializers.get(initializer)
    # `initializer` is now a keras Initializer (mypy keeps the parameter's union type).
    return initializer.__class__.from_config(initializer.get_config())  # type: ignore[union-attr]
