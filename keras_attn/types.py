"""Type aliases used in annotations across `keras_attn`.

Layer math runs on `keras.ops`, so one function may receive a TensorFlow, JAX or PyTorch
tensor, or a NumPy array: no single static type covers them all, and `Tensor` names that
role. None of these aliases does anything at run time.
"""

from collections.abc import Callable
from typing import Any, TypeAlias

#: A backend tensor (TensorFlow, JAX or PyTorch) or a NumPy array.
Tensor: TypeAlias = Any

#: A tensor shape as Keras passes it to `build` and `compute_output_shape`: unknown sizes are
#: `None`.
Shape: TypeAlias = tuple[int | None, ...]

#: A dtype: a name such as `"float32"`, or a backend's dtype object (`tensor.dtype`).
DType: TypeAlias = Any

#: What `keras.initializers.get` accepts: a name, a serialized config, or an initializer
#: (an initializer instance is callable).
Initializer: TypeAlias = str | dict[str, Any] | Callable[..., Any]
