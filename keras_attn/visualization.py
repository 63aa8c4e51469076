"""Attention maps: the weights of every block for given inputs, and heatmaps of them."""

import keras
import numpy as np
from keras import ops

from keras_attn.layers.transformer_decoder import TransformerDecoder
from keras_attn.layers.transformer_encoder import TransformerEncoder


def _blocks(model, cls, prefix):
    blocks = [
        layer for layer in model.layers if isinstance(layer, cls) and layer.name.startswith(prefix)
    ]
    return sorted(blocks, key=lambda layer: int(layer.name.rsplit("_", 1)[1]))


def _numpy(tree):
    return keras.tree.map_structure(ops.convert_to_numpy, tree)


def _run_encoder_blocks(blocks, x, padding_mask, maps):
    for block in blocks:
        x, weights = block(x, padding_mask=padding_mask, return_attention_scores=True)
        maps[block.name] = {"self": weights}
    return x


def attention_maps(model, inputs):
    """The attention weights of every block of `model` for `inputs`, in one call.

    Runs the model's own layers again with `return_attention_scores=True` (the explicit
    softmax path, so weights exist even where inference uses a fused kernel).

    Args:
        model: a `CausalLM`, `Encoder`, `Seq2Seq`, a head whose `encoder` is an `Encoder`
            (for `MultipleChoice`, pass its encoder and one choice's inputs), or a functional
            causal LM of our layers (the contract of `keras_attn.decoding.stack`).
        inputs: what `model` takes.
    Returns:
        dict `{block name: {"self": (batch, heads, T, T)[, "cross": (batch, heads, T, S)]}}`
        of NumPy arrays, in block order.
    """
    from keras_attn.models import CausalLM, Encoder, Seq2Seq

    model = getattr(model, "encoder", model)
    maps = {}
    if isinstance(model, Encoder):
        inputs = {key: ops.convert_to_tensor(value) for key, value in inputs.items()}
        embeddings = model.get_layer("embeddings")
        segments = (inputs["segment_ids"],) if "segment_ids" in inputs else ()
        x = embeddings(inputs["token_ids"], *segments, start_index=model.position_offset)
        _run_encoder_blocks(
            _blocks(model, TransformerEncoder, "encoder_block"),
            x,
            model.padding_mask(inputs),
            maps,
        )
    elif isinstance(model, Seq2Seq):
        source = ops.convert_to_tensor(inputs["encoder_token_ids"])
        target = ops.convert_to_tensor(inputs["decoder_token_ids"])
        shared = model.target_vocabulary_size is None
        x = model.get_layer("encoder_token_embedding")(source)
        x = x + model.get_layer("encoder_positions")(x)
        source_mask = ops.not_equal(source, 0)
        x = _run_encoder_blocks(
            _blocks(model, TransformerEncoder, "encoder_block"), x, source_mask, maps
        )
        if model.normalize_first:
            x = model.get_layer("encoder_final_norm")(x)
        table = "encoder_token_embedding" if shared else "decoder_token_embedding"
        y = model.get_layer(table)(target)
        y = y + model.get_layer("decoder_positions")(y)
        for block in _blocks(model, TransformerDecoder, "decoder_block"):
            y, self_weights, cross_weights = block(
                y,
                x,
                decoder_padding_mask=ops.not_equal(target, 0),
                encoder_padding_mask=source_mask,
                return_attention_scores=True,
            )
            maps[block.name] = {"self": self_weights, "cross": cross_weights}
    else:  # a CausalLM, or a functional causal LM of ours (else CausalStack says why not)
        from keras_attn.decoding.stack import CausalStack

        stack = CausalStack(model, verify=not isinstance(model, CausalLM))
        token_ids = ops.convert_to_tensor(inputs)
        x = stack.embed(token_ids, 0)
        mask = stack.padding(token_ids)
        for block in stack.blocks:
            x, weights = block(x, decoder_padding_mask=mask, return_attention_scores=True)
            maps[block.name] = {"self": weights}
    return _numpy(maps)


def plot_attention(weights, query_tokens, key_tokens, path, title=None, heads=None):
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
