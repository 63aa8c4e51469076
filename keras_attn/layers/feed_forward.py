"""Position-wise feed-forward network: the same two-layer MLP applied at every position."""

import math
from collections.abc import Callable
from typing import Any

import keras
from keras import ops

from keras_attn.layers.initializers import fresh
from keras_attn.types import Initializer, Shape, Tensor


def gelu(x: Tensor) -> Tensor:
    """Exact GELU, `0.5·x·(1 + erf(x/√2))`.

    Written out rather than `keras.activations.gelu`: TensorFlow's own gelu lowers to an `Erfc`
    op that tf2onnx cannot convert (the ONNX file it writes then fails to load); `Erf` converts.
    """
    x = ops.convert_to_tensor(x)  # NumPy in: `ndarray * tensor` fails on PyTorch
    return 0.5 * x * (1.0 + ops.erf(x * (1.0 / math.sqrt(2.0))))


def gelu_tanh(x: Tensor) -> Tensor:
    """GELU's tanh approximation (GPT-2, BERT's original code)."""
    x = ops.convert_to_tensor(x)
    inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)
    return 0.5 * x * (1.0 + ops.tanh(inner))


ACTIVATIONS = {
    "relu": ops.relu,
    "gelu": gelu,
    "gelu_tanh": gelu_tanh,
    "swish": ops.silu,
    "silu": ops.silu,
}


def get_activation(name: str) -> Callable[[Tensor], Tensor]:
    if name not in ACTIVATIONS:
        raise ValueError(
            f"`activation` must be one of {sorted(ACTIVATIONS)}. Received: activation={name!r}"
        )
    return ACTIVATIONS[name]


@keras.saving.register_keras_serializable(package="keras_attn")
class FeedForward(keras.layers.Layer):
    """`W_2 · act(W_1 · x + b_1) + b_2`, applied to each position independently; gated
    (`gated=True`, GLU variants such as Llama's SwiGLU): `W_2 · (act(W_g · x) ⊙ (W_1 · x))`.

    Args:
        intermediate_dim: int. Hidden width (4× the model width in Vaswani et al.).
        activation: `"relu"` (default), `"gelu"` (exact), `"gelu_tanh"`, `"swish"`/`"silu"`.
        dropout: float. Dropout on the output during training. Defaults to `0.0`.
        output_dim: int. Output width. Defaults to the input width.
        use_bias: bool. Defaults to `True`.
        gated: bool. A third projection `gate` whose activation multiplies the
            `intermediate` one (SwiGLU with `activation="silu"`). Defaults to `False`.
        kernel_initializer, bias_initializer: initializers of both layers.
    Call arguments:
        inputs: float `(..., dim)`.
    Returns:
        `(..., output_dim or dim)`.
    Example:
        >>> tuple(FeedForward(64, activation="gelu")(keras.random.normal((2, 5, 16))).shape)
        (2, 5, 16)
    """

    def __init__(
        self,
        intermediate_dim: int,
        activation: str = "relu",
        dropout: float = 0.0,
        output_dim: int | None = None,
        use_bias: bool = True,
        kernel_initializer: Initializer = "glorot_uniform",
        bias_initializer: Initializer = "zeros",
        gated: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        for name, value in (("intermediate_dim", intermediate_dim), ("output_dim", output_dim)):
            if value is None and name == "output_dim":
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"`{name}` must be a positive integer. Received: {name}={value!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"`dropout` must be in [0, 1). Received: dropout={dropout}")
        self.activation_fn = get_activation(activation)
        self.intermediate_dim = intermediate_dim
        self.activation = activation
        self.dropout = dropout
        self.output_dim = output_dim
        self.use_bias = use_bias
        self.gated = gated
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.supports_masking = True

    def _dense(self, units, name):
        return keras.layers.Dense(
            units,
            use_bias=self.use_bias,
            kernel_initializer=fresh(self.kernel_initializer),
            bias_initializer=fresh(self.bias_initializer),
            dtype=self.dtype_policy,
            name=name,
        )

    def build(self, inputs_shape: Shape) -> None:
        if inputs_shape[-1] is None:
            raise ValueError(
                f"The last axis of `inputs` must be known. Received: inputs.shape={inputs_shape}"
            )
        self.intermediate_dense = self._dense(self.intermediate_dim, "intermediate")
        self.intermediate_dense.build(inputs_shape)
        self.gate_dense = None
        if self.gated:
            self.gate_dense = self._dense(self.intermediate_dim, "gate")
            self.gate_dense.build(inputs_shape)
        self.output_dense = self._dense(self.output_dim or inputs_shape[-1], "output")
        self.output_dense.build((*inputs_shape[:-1], self.intermediate_dim))
        self.dropout_layer = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)

    def call(self, inputs: Tensor, training: bool | None = None) -> Tensor:
        if self.gate_dense is not None:
            hidden = self.activation_fn(self.gate_dense(inputs)) * self.intermediate_dense(inputs)
        else:
            hidden = self.activation_fn(self.intermediate_dense(inputs))
        return self.dropout_layer(self.output_dense(hidden), training=training)

    def compute_output_shape(self, inputs_shape: Shape) -> Shape:
        return (*inputs_shape[:-1], self.output_dim or inputs_shape[-1])

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "intermediate_dim": self.intermediate_dim,
            "activation": self.activation,
            "dropout": self.dropout,
            "output_dim": self.output_dim,
            "use_bias": self.use_bias,
            "gated": self.gated,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            "bias_initializer": keras.initializers.serialize(self.bias_initializer),
        }
