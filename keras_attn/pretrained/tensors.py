"""How one of our variables is stored in a Hugging Face checkpoint, and the small builders the
layouts use: PyTorch's `nn.Linear` keeps `(out, in)` (transposed against a Keras kernel),
GPT-2's `Conv1D` keeps `(in, out)` as Keras does and packs q|k|v into one tensor; our per-head
kernels `(in, heads, head_dim)` and `(heads, head_dim, out)` are flattened to two axes.
"""

import dataclasses
import math
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True)
class Tensor:
    """Where and how one of our variables is stored in a checkpoint.

    Attributes:
        key: the checkpoint key.
        linear: stored as `nn.Linear` does, `(out, in)`: transposed against our kernel.
        in_axes: leading axes of our variable that form the input dimension (kernels: 1, or 2
            for an attention output `(heads, head_dim, out)`); 0 for a vector (bias, norm).
        part, parts: this variable is slice `part` of `parts` equal slices of the stored
            tensor's last axis (GPT-2's fused q|k|v).
        row: a vector stored as one row `(1, n)` (BART's `final_logits_bias`).
    """

    key: str
    linear: bool = False
    in_axes: int = 0
    part: int = 0
    parts: int = 1
    row: bool = False

    def stored_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The checkpoint shape holding a variable of `shape` (the whole fused tensor)."""
        if self.in_axes == 0:
            flat: tuple[int, ...] = (1, math.prod(shape)) if self.row else (math.prod(shape),)
        else:
            flat = (math.prod(shape[: self.in_axes]), math.prod(shape[self.in_axes :]))
        flat = (*flat[:-1], flat[-1] * self.parts)
        return flat[::-1] if self.linear else flat

    def to_ours(self, array: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        """Our variable's value of `shape` from the stored tensor."""
        expected = self.stored_shape(shape)
        if tuple(array.shape) != expected:
            raise ValueError(
                f"Checkpoint tensor {self.key!r} has shape {tuple(array.shape)}; the model "
                f"needs {expected} (config.json and the weights disagree)."
            )
        if self.linear:
            array = array.T
        if self.parts > 1:
            array = np.split(array, self.parts, axis=-1)[self.part]
        return np.reshape(array, shape)

    def to_stored(self, value: np.ndarray) -> np.ndarray:
        """The stored form of our variable's value (one slice, for a fused tensor)."""
        shape = value.shape
        if self.in_axes == 0:
            return np.reshape(value, (1, -1) if self.row else (-1,))
        value = np.reshape(value, (math.prod(shape[: self.in_axes]), -1))
        return value.T if self.linear else value


def table(key: str) -> Tensor:
    """An embedding table `(rows, dim)`, stored as it is."""
    return Tensor(key, in_axes=1)


def linear(prefix: str, in_axes: int = 1, bias_key: str | None = None) -> dict[str, Tensor]:
    """Kernel and bias of a PyTorch `nn.Linear` named `prefix`."""
    return {
        "kernel": Tensor(f"{prefix}.weight", linear=True, in_axes=in_axes),
        "bias": Tensor(bias_key or f"{prefix}.bias"),
    }


def norm(prefix: str) -> dict[str, Tensor]:
    return {"gamma": Tensor(f"{prefix}.weight"), "beta": Tensor(f"{prefix}.bias")}


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Tensor]:
    """`{"a": {"b": x}}` -> `{"a/b": x}`: our variable paths."""
    out: dict[str, Tensor] = {}
    for name, value in tree.items():
        path = f"{prefix}/{name}" if prefix else name
        out.update(flatten(value, path) if isinstance(value, dict) else {path: value})
    return out


def attention_block(names: dict[str, str]) -> dict[str, Any]:
    """Our block's variables (attention + feed-forward + two norms) from the checkpoint's
    names of each part."""
    return {
        "self_attention": {
            "query": linear(names["query"]),
            "key": linear(names["key"]),
            "value": linear(names["value"]),
            "attention_output": linear(names["output"], in_axes=2),
        },
        "self_attention_layer_norm": norm(names["attention_norm"]),
        "feed_forward": {
            "intermediate": linear(names["intermediate"]),
            "output": linear(names["ffn_output"]),
        },
        "feed_forward_layer_norm": norm(names["ffn_norm"]),
    }
