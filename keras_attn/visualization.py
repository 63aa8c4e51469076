"""Attention maps: the weights of every block for given inputs, and heatmaps of them."""

import os
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import keras
import numpy as np
from keras import ops

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def _numpy(tree):
    return keras.tree.map_structure(ops.convert_to_numpy, tree)


def attention_maps(model: keras.Model, inputs: Any) -> dict[str, dict[str, np.ndarray]]:
    """The attention weights of every block of `model` for `inputs`, in one call.

    Asks the model for them (`call_with_attention_scores`, which runs its own layers with
    `return_attention_scores=True`: the explicit softmax path, so weights exist even where
    inference uses a fused kernel).

    Args:
        model: a `CausalLM`, `EncoderBackbone`, `Seq2SeqLM`, an encoder task (its backbone's
            maps; for `MultipleChoice`, pass its backbone and one choice's inputs), or a
            functional causal LM of our layers (`keras_attn.models.cached.FunctionalCausalLM`).
        inputs: what `model` takes.
    Returns:
        dict `{block name: {"self": (batch, heads, T, T)[, "cross": (batch, heads, T, S)]}}`
        of NumPy arrays, in block order.
    """
    from keras_attn.models.cached import cached_causal_lm

    if not hasattr(model, "call_with_attention_scores"):
        model = getattr(model, "backbone", model)
    if not hasattr(model, "call_with_attention_scores") and hasattr(model, "decoder_blocks"):
        raise ValueError(
            f"`model` {model.name!r} is a decoder backbone: its attention maps come from its "
            "task, which owns the cached call (`attention_maps(CausalLM(backbone), ids)`)."
        )
    if not hasattr(model, "call_with_attention_scores"):
        model = cached_causal_lm(model)  # raises, naming the contract, if it is not one
    return _numpy(model.call_with_attention_scores(inputs)[1])


def plot_attention(
    weights: Any,
    query_tokens: Sequence[str],
    key_tokens: Sequence[str],
    path: str | os.PathLike[str],
    title: str | None = None,
    heads: Iterable[int] | None = None,
) -> "Figure":
    """Writes a PNG heatmap of attention weights with the tokens on both axes.

    Args:
        weights: array `(T, S)` (one head) or `(H, T, S)` (one panel per head).
        query_tokens: `T` labels for the rows (who attends). key_tokens: `S` labels for the
            columns (attended to).
        path: where to write the PNG.
        title: optional figure title.
        heads: optional list of head indices to draw; all by default.
    Returns:
        the matplotlib `Figure` (close it with `matplotlib.pyplot.close(fig)`).
    """
    import matplotlib

    matplotlib.use("Agg")  # files only; no display needed
    import matplotlib.pyplot as plt

    weights = np.asarray(weights, dtype="float64")
    if weights.ndim == 2:
        weights = weights[None]
    if weights.ndim != 3:
        raise ValueError(
            f"`weights` must be (T, S) or (heads, T, S). Received: weights.shape={weights.shape}"
        )
    if weights.shape[1:] != (len(query_tokens), len(key_tokens)):
        raise ValueError(
            "`weights` must be (len(query_tokens), len(key_tokens)) per head. Received: "
            f"weights.shape={weights.shape}, {len(query_tokens)} query and "
            f"{len(key_tokens)} key tokens"
        )
    heads = list(range(len(weights))) if heads is None else list(heads)
    size = 0.35 * max(len(query_tokens), len(key_tokens)) + 1.5
    fig, axes = plt.subplots(1, len(heads), figsize=(size * len(heads), size), squeeze=False)
    for ax, head in zip(axes[0], heads, strict=True):
        image = ax.imshow(weights[head], cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
        ax.set_xticks(range(len(key_tokens)), labels=list(key_tokens), rotation=90)
        ax.set_yticks(range(len(query_tokens)), labels=list(query_tokens))
        ax.set_xlabel("attended to (keys)")
        ax.set_ylabel("attending (queries)")
        if len(heads) > 1 or weights.shape[0] > 1:
            ax.set_title(f"head {head}")
    fig.colorbar(image, ax=list(axes[0]), shrink=0.8)
    if title:
        fig.suptitle(title)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    return fig
