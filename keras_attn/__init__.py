"""keras_attn: attention and Transformer layers for Keras 3.

Every public layer is importable from here and from `keras_attn.layers`.
"""

from keras_attn.layers import *  # noqa: F403  (the public API is `keras_attn.layers.__all__`)
from keras_attn.layers import __all__ as _layers_all

__version__ = "0.1.0"
__all__ = [*_layers_all]
