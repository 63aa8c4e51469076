"""A small ONNX graph builder for graphs written from Keras weights (`decode_gqa.onnx`):
nodes, initializers kept inside or streamed to an external-data file as they are made, and
the transformer pieces (dense, normalization, activation) in onnxruntime's operators, their
projections weight-only quantized (`MatMulNBits`) when the graph is given a `WeightOnly`."""

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from keras_attn_export.keras_int4 import QuantizedKernel, int4_kernel, is_int4

if TYPE_CHECKING:
    import keras
    import onnx
    from keras_attn_export.weight_only import WeightOnly
    from numpy.typing import ArrayLike


def layer_weights(layer: "keras.layers.Layer") -> list[np.ndarray]:
    return [np.asarray(w, np.float32) for w in layer.get_weights()]


def kernel_bias(
    dense: "keras.layers.Layer", width: int
) -> tuple["np.ndarray | QuantizedKernel", np.ndarray]:
    """A projection's kernel `(in, width)` (a `QuantizedKernel` for a layer quantized to
    int4 in Keras) and its bias, zeros where it has none."""
    kernel: np.ndarray | QuantizedKernel = (
        int4_kernel(dense) if is_int4(dense)
        else np.asarray(dense.kernel, np.float32).reshape(-1, width)
    )  # fmt: skip
    bias = dense.bias
    return kernel, np.zeros(width, np.float32) if bias is None else np.asarray(bias).reshape(-1)


# External tensors start on 64 KiB boundaries (the largest page size onnxruntime maps).
EXTERNAL_DATA_ALIGNMENT = 1 << 16
# Smaller tensors (shapes, scalars, biases and norms' scales of narrow models) stay inside.
EXTERNAL_TENSOR_BYTES = 1 << 12


class Graph:
    nodes: list["onnx.NodeProto"]
    initializers: list["onnx.TensorProto"]
    count: int

    def __init__(
        self, opset: int = 17, data: "Any | None" = None, weights: "WeightOnly | None" = None
    ) -> None:
        """`data`: an open binary file beside the graph that large tensors are written to as
        they are made (`Graph.const`), or None to keep every tensor in the graph. `weights`:
        how projections are quantized (`MatMulNBits`), or None for float32 MatMuls."""
        self.nodes, self.initializers, self.count = [], [], 0
        self.opset = opset
        self.data = data
        self.weights = weights

    def const(self, name: str, array: "ArrayLike") -> str:
        import onnx
        from onnx import helper, numpy_helper

        array = np.asarray(array)
        if self.data is None or array.nbytes < EXTERNAL_TENSOR_BYTES:
            self.initializers.append(numpy_helper.from_array(array, name))
            return name
        offset = -self.data.tell() % EXTERNAL_DATA_ALIGNMENT + self.data.tell()
        self.data.seek(offset)
        self.data.write(np.ascontiguousarray(array, array.dtype.newbyteorder("<")).data)
        dtype = helper.np_dtype_to_tensor_dtype(array.dtype)
        tensor = onnx.TensorProto(name=name, dims=array.shape, data_type=dtype)
        location = Path(self.data.name).name
        for key, value in (("location", location), ("offset", offset), ("length", array.nbytes)):
            tensor.external_data.add(key=key, value=str(value))
        tensor.data_location = onnx.TensorProto.EXTERNAL
        self.initializers.append(tensor)
        return name

    def alias(self, name: str, existing: str, shape: tuple[int, ...]) -> str:
        """Initializer `name`: `existing`'s values in `shape` (as many elements), the same
        bytes of the external-data file when it is there, else a copy."""
        import onnx
        from onnx import numpy_helper

        (tensor,) = [t for t in self.initializers if t.name == existing]
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            alias = onnx.TensorProto()
            alias.CopyFrom(tensor)
            alias.name = name
            del alias.dims[:]
            alias.dims.extend(shape)
            self.initializers.append(alias)
            return name
        return self.const(name, numpy_helper.to_array(tensor).reshape(shape))

    def quantized(self, prefix: str, kernel: "ArrayLike") -> tuple[str, str]:
        """A `(K, N)` kernel quantized (`WeightOnly.quantize`): the names of its integers and
        of its scales."""
        if self.weights is None:
            raise ValueError("Graph.quantized needs a graph built with `weights`")
        packed, scales = self.weights.quantize(np.asarray(kernel))
        bits = self.weights.bits
        return self.const(f"{prefix}.q{bits}", packed), self.const(f"{prefix}.scales", scales)

    def matmul(self, x: str, kernel: "ArrayLike | QuantizedKernel", prefix: str) -> Any:
        """`x · kernel`: a MatMul, or a `MatMulNBits` over the kernel quantized (by the
        graph's `weights`, or in Keras: a `QuantizedKernel`, computed in float32 as Keras
        does)."""
        if isinstance(kernel, QuantizedKernel):
            inputs = [x, self.const(f"{prefix}.q4", kernel.packed),
                      self.const(f"{prefix}.scales", kernel.scales)]  # fmt: skip
            if kernel.zero_points is not None:
                inputs.append(self.const(f"{prefix}.zero_points", kernel.zero_points))
            return self.op("MatMulNBits", inputs, domain="com.microsoft", K=kernel.k,
                           N=kernel.n, bits=4, block_size=kernel.block_size,
                           accuracy_level=1)  # fmt: skip
        if self.weights is None:
            return self.op("MatMul", [x, self.const(f"{prefix}.kernel", kernel)])
        k, n = np.shape(kernel)
        return self.op("MatMulNBits", [x, *self.quantized(prefix, kernel)],
                       domain="com.microsoft", **self.weights.matmul_attributes(k, n))  # fmt: skip

    def op(
        self,
        op_type: str,
        inputs: list[str],
        outputs: int | list[str] = 1,
        domain: str = "",
        **attrs: Any,
    ) -> Any:
        from onnx import helper

        self.count += 1
        if isinstance(outputs, list):
            names = outputs
        else:
            names = [f"{op_type.lower()}_{self.count}_{i}" for i in range(outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, names, domain=domain, **attrs))
        return names[0] if len(names) == 1 else names

    def dense(
        self, x: str, kernel: "ArrayLike | QuantizedKernel", bias: "ArrayLike", prefix: str
    ) -> Any:
        return self.op("Add", [self.matmul(x, kernel, prefix), self.const(f"{prefix}.bias", bias)])

    def layer_norm(self, x: str, layer: "keras.layers.Layer", prefix: str) -> Any:
        import keras

        if isinstance(layer, keras.layers.RMSNormalization):  # x / sqrt(mean(x²) + ε) · scale
            # Plain operators (onnxruntime's SimplifiedLayerNormalization is outside the onnx
            # checker's schemas; its session optimizer fuses these into it).
            if self.opset >= 18:
                if not any(i.name == "last_axis" for i in self.initializers):
                    self.const("last_axis", np.array([-1], np.int64))
                mean = self.op("ReduceMean", [self.op("Mul", [x, x]), "last_axis"], keepdims=1)
            else:
                mean = self.op("ReduceMean", [self.op("Mul", [x, x])], axes=[-1], keepdims=1)
            epsilon = self.const(f"{prefix}.epsilon", np.array(layer.epsilon, np.float32))
            rms = self.op("Sqrt", [self.op("Add", [mean, epsilon])])
            scale = self.const(f"{prefix}.scale", layer_weights(layer)[0])
            return self.op("Mul", [self.op("Div", [x, rms]), scale])
        gamma, beta = layer_weights(layer)
        return self.op(
            "LayerNormalization",
            [x, self.const(f"{prefix}.gamma", gamma), self.const(f"{prefix}.beta", beta)],
            axis=-1, epsilon=float(layer.epsilon),
        )  # fmt: skip

    def activation(self, x: str, name: str) -> Any:
        if name == "relu":
            return self.op("Relu", [x])
        if name == "gelu":
            return self.op("Gelu", [x], domain="com.microsoft")  # exact, erf
        if name == "gelu_tanh":
            return self.op("FastGelu", [x], domain="com.microsoft")
        return self.op("Mul", [x, self.op("Sigmoid", [x])])  # swish / silu
