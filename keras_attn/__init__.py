"""keras_attn: attention and Transformer layers for Keras 3.

Every public layer is importable from here and from `keras_attn.layers`.
"""

# Importing the subpackages registers their serializable classes: after `import keras_attn`,
# `keras.saving.load_model` finds every model, head, tokenizer, packer, loss, metric and
# schedule of ours with no custom_objects. Tokenizers and packers need tensorflow-text (~0.4
# s to import); where it is not installed (JAX or PyTorch only) the rest still loads.
from keras_attn import losses, metrics, models, optimizers  # noqa: F401
from keras_attn.layers import *  # noqa: F403  (the public API is `keras_attn.layers.__all__`)
from keras_attn.layers import __all__ as _layers_all

try:
    from keras_attn import preprocessing, tokenizers  # noqa: F401
except ModuleNotFoundError as error:
    if error.name not in ("tensorflow", "tensorflow_text"):
        raise

__version__ = "0.1.0"
__all__ = [*_layers_all]
