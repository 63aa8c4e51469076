"""GPT-style causal language model: a decoder backbone (embeddings, decoder blocks, final norm)
and the task on it (output tied to the token embedding, cached call, generation)."""

import os
from typing import TYPE_CHECKING, Any, Self, TypeVar

import keras
from keras import ops

from keras_attn.checks import check_choice, check_positive_ints, check_rate, check_renamed
from keras_attn.layers.embeddings import TokenEmbedding
from keras_attn.layers.token_and_position_embedding import (
    POSITION_ENCODINGS,
    position_encoding_layer,
)
from keras_attn.layers.transformer_block import normalization_layer
from keras_attn.layers.transformer_decoder import TransformerDecoder
from keras_attn.losses import SparseCrossEntropy
from keras_attn.models.backbone import Backbone, HoldsBackbone
from keras_attn.models.cached import CachedCausalLM
from keras_attn.models.task import Task, float32_logits
from keras_attn.pretrained import save_pretrained
from keras_attn.pretrained.chat import folder_chat
from keras_attn.pretrained.registry import register_model_class

if TYPE_CHECKING:
    from keras_attn.decoding import Runner

_BackboneT = TypeVar("_BackboneT", bound=keras.Model)


@keras.saving.register_keras_serializable(package="keras_attn")
class DecoderBackbone(Backbone):
    """GPT-style decoder stack: `token_ids (batch, seq) int32 -> hidden states (batch, seq,
    hidden_dim)`, the backbone of `CausalLM`.

    Token id 0 is padding: `mask_zero=True` creates the padding mask, which reaches every
    block by Keras mask propagation (and, in a `CausalLM`, masks padded positions out of the
    loss). Pre-norm blocks end with a final LayerNorm, included in the output.

    The Llama family (Llama, Mistral, Qwen2, SmolLM, TinyLlama) is a configuration:
    `position_encoding="rotary"` (no position table; queries and keys rotated by
    `rope_max_wavelength`, Hugging Face's `rope_theta`), `normalization="rms_norm"`,
    `gated_feed_forward=True, activation="silu"` (SwiGLU), `num_key_value_heads` (GQA),
    `attention_bias=False, feed_forward_bias=False`, `tie_word_embeddings=False`, and
    `mask_zero=False`. `from_pretrained` sets all of them from a folder's `config.json`.

    Args:
        vocabulary_size: int. Number of token ids.
        max_sequence_length: int. Longest input (size of the learned position table).
        hidden_dim: int. Model width. Defaults to `128`.
        num_layers: int. Decoder blocks. Defaults to `2`.
        num_heads: int. Attention heads per block. Defaults to `4`.
        intermediate_dim: int. Feed-forward width; defaults to `4 * hidden_dim`.
        dropout: float. Dropout in embeddings and blocks. Defaults to `0.0`.
        normalize_first: bool. Pre-norm blocks plus a final LayerNorm (GPT-2), or post-norm.
        activation: feed-forward activation. Defaults to `"gelu"`.
        position_encoding: `"learned"`, `"sinusoidal"` or `"rotary"` (no position table:
            rotary queries and keys in every block; `max_sequence_length` still bounds
            generation).
        mask_zero: bool. Id 0 is padding, masked in attention and in the loss. GPT-2's id 0
            is a real token (`"!"`): there pad on the right, where the causal mask already
            keeps padding out of every real position. Defaults to `True`.
        layer_norm_epsilon: float. Defaults to `1e-5` (GPT-2's).
        padding_mask_input: bool. Inputs become a dict of `token_ids` and `padding_mask`
            (`(batch, seq)`, 1 = real token, Hugging Face's `attention_mask`); positions count
            real tokens only, so left-padded rows give the logits of the unpadded ones.
            Defaults to `False` (ids in, padding from `mask_zero`).
        num_key_value_heads: optional int. Grouped-query attention (must divide `num_heads`).
        head_dim: optional int. Width of each head; defaults to `hidden_dim // num_heads`.
        normalization: `"layer_norm"` (default) or `"rms_norm"`.
        gated_feed_forward: bool. Gated feed-forward (SwiGLU with `"silu"`).
        attention_bias, attention_output_bias, feed_forward_bias: biases of W_q/W_k/W_v, of
            W_O (defaults to `attention_bias`) and of the feed-forward network.
        rope_max_wavelength: float. Rotary base for `position_encoding="rotary"`. Defaults to
            `10000`.
        rope_scaling: optional dict: Hugging Face's `rope_scaling` (`"linear"`, `"llama3"`).
        tie_word_embeddings: bool. The output projection is the token embedding transposed
            (GPT-2); `False` gives it its own matrix (Llama). Defaults to `True`.
    Example:
        >>> import numpy as np
        >>> backbone = DecoderBackbone(vocabulary_size=100, max_sequence_length=32, hidden_dim=16)
        >>> tuple(backbone(np.array([[5, 6, 7]])).shape)
        (1, 3, 16)
    """

    config_args = (
        "vocabulary_size", "max_sequence_length", "hidden_dim", "num_layers", "num_heads",
        "intermediate_dim", "dropout", "normalize_first", "activation", "position_encoding",
        "mask_zero", "layer_norm_epsilon", "padding_mask_input", "num_key_value_heads",
        "head_dim", "normalization", "gated_feed_forward", "attention_bias",
        "attention_output_bias", "feed_forward_bias", "rope_max_wavelength", "rope_scaling",
        "tie_word_embeddings",
    )  # fmt: skip

    def __init__(
        self,
        vocabulary_size: int,
        max_sequence_length: int | None = None,
        hidden_dim: int = 128,
        num_layers: int = 2,
        num_heads: int = 4,
        intermediate_dim: int | None = None,
        dropout: float = 0.0,
        normalize_first: bool = True,
        activation: str = "gelu",
        position_encoding: str = "learned",
        mask_zero: bool = True,
        layer_norm_epsilon: float = 1e-5,
        padding_mask_input: bool = False,
        num_key_value_heads: int | None = None,
        head_dim: int | None = None,
        normalization: str = "layer_norm",
        gated_feed_forward: bool = False,
        attention_bias: bool = True,
        attention_output_bias: bool | None = None,
        feed_forward_bias: bool = True,
        rope_max_wavelength: float = 10000.0,
        rope_scaling: dict[str, Any] | None = None,
        tie_word_embeddings: bool = True,
        name: str = "decoder_backbone",
        **kwargs: Any,
    ) -> None:
        check_renamed(kwargs, ("sequence_length",))
        check_positive_ints(
            vocabulary_size=vocabulary_size,
            max_sequence_length=max_sequence_length,
            hidden_dim=hidden_dim,
            num_layers=num_layers,
            num_heads=num_heads,
        )
        check_rate("dropout", dropout)
        check_choice("position_encoding", position_encoding, (*POSITION_ENCODINGS, "rotary"))
        rotary = position_encoding == "rotary"
        token_ids = keras.Input((None,), dtype="int32", name="token_ids")
        inputs, block_kwargs, position_kwargs = token_ids, {}, {}
        if padding_mask_input:
            padding_mask = keras.Input((None,), dtype="int32", name="padding_mask")
            inputs = {"token_ids": token_ids, "padding_mask": padding_mask}
            block_kwargs["decoder_padding_mask"] = ops.cast(padding_mask, "bool")
            # Each token's position counts the real tokens before it (left padding).
            counted = ops.cumsum(ops.cast(padding_mask, "int32"), axis=1)
            position_kwargs["position_ids"] = ops.maximum(counted - 1, 0)
        token_embedding = TokenEmbedding(
            vocabulary_size,
            hidden_dim,
            mask_zero=mask_zero and not padding_mask_input,
            tie_weights=tie_word_embeddings,
            name="token_embedding",
        )
        x = token_embedding(token_ids)
        position_embedding = None
        if rotary:  # positions enter each block's attention; per-row ones for left padding
            block_kwargs.update(position_kwargs)
        else:
            position_embedding = position_encoding_layer(
                position_encoding,
                max_sequence_length,  # type: ignore[arg-type]  # None: sinusoidal (layers/ annotates it `int`)
                "position_embedding",
            )
            positions = position_embedding(x, **position_kwargs)
            x = keras.layers.Add(name="embeddings_add")([x, positions])
        x = keras.layers.Dropout(dropout, name="embeddings_dropout")(x)
        blocks = [
            TransformerDecoder(
                num_heads=num_heads,
                intermediate_dim=intermediate_dim or 4 * hidden_dim,
                dropout=dropout,
                activation=activation,
                normalize_first=normalize_first,
                layer_norm_epsilon=layer_norm_epsilon,
                key_dim=head_dim,
                num_key_value_heads=num_key_value_heads,
                normalization=normalization,
                gated_feed_forward=gated_feed_forward,
                attention_bias=attention_bias,
                attention_output_bias=attention_output_bias,
                feed_forward_bias=feed_forward_bias,
                rope_max_wavelength=rope_max_wavelength if rotary else None,
                rope_scaling=rope_scaling if rotary else None,
                name=f"decoder_block_{i}",
            )
            for i in range(num_layers)
        ]
        for block in blocks:
            x = block(x, **block_kwargs)
        final_norm = None
        if normalize_first:
            final_norm = normalization_layer(normalization, layer_norm_epsilon, "final_layer_norm")
            x = final_norm(x)
        super().__init__(inputs, x, name=name, **kwargs)
        self._set_config_args(locals())
        # What `CausalLM`'s cached call (`keras_attn.models.cached.CachedCausalLM`) runs.
        self.token_embedding = token_embedding
        self.position_embedding = position_embedding
        self.decoder_blocks = blocks
        self.final_norm = final_norm


@keras.saving.register_keras_serializable(package="keras_attn")
class CausalLM(HoldsBackbone, CachedCausalLM, Task):
    """GPT-style causal LM: a `DecoderBackbone`, then the token embedding transposed (tied
    output weights, as GPT-2): `token_ids (batch, seq) int32 -> logits (batch, seq, vocab)`,
    float32 under mixed precision.

    `CausalLM(backbone)` wraps a backbone; `CausalLM(vocabulary_size, max_sequence_length,
    ...)` builds the `DecoderBackbone` of those arguments first. The task answers its
    backbone's arguments (`lm.vocabulary_size`) and layers (`lm.decoder_blocks`), and owns the
    cached call (`call_with_cache`) that decoding, attention maps and the ONNX decode graphs run.

    Args:
        backbone: a `DecoderBackbone`; or its first argument, `vocabulary_size`, with the
            rest of its arguments as keywords (or positionally).
        preprocessor: optional `TextPreprocessor`: `fit`, `predict`, `generate` and export
            then take raw strings through it (saved inside `.keras`).
    Example:
        >>> lm = CausalLM(vocabulary_size=100, max_sequence_length=32, hidden_dim=16)
        >>> [len(ids) for ids in lm.generate([[5, 6, 7]], max_new_tokens=4)]  # four new ids
        [4]
        >>> lm.backbone.hidden_dim, lm.hidden_dim
        (16, 16)
    """

    fine_tuning_rate = 2e-5  # `compile(optimizer="auto")` on a pretrained backbone

    config_args = ("backbone",)
    nested_models = ("backbone",)

    def __init__(
        self,
        backbone: "DecoderBackbone | int | None" = None,
        *args: Any,
        preprocessor: Any = None,
        name: str = "causal_lm",
        **kwargs: Any,
    ) -> None:
        trainable = {key: kwargs.pop(key) for key in ("trainable",) if key in kwargs}
        backbone = backbone_of(DecoderBackbone, backbone, args, kwargs)
        inputs = fresh_inputs(backbone)
        x = backbone(inputs)
        logits = float32_logits(backbone.token_embedding(x, reverse=True), "logits")
        super().__init__(inputs, logits, name=name, preprocessor=preprocessor, **trainable)
        self.backbone = backbone

    def default_loss(self) -> SparseCrossEntropy:
        return lm_loss()

    @classmethod
    def from_pretrained(
        cls,
        folder: str | os.PathLike[str],
        strict: bool = True,
        preprocessor: Any = "auto",
        **kwargs: Any,
    ) -> Self:
        """A causal LM on `DecoderBackbone.from_pretrained(folder, **kwargs)` (a Hugging
        Face GPT-2, Llama, Mistral or Qwen2 folder); the output layer is the token embedding
        (tied, or its own `lm_head`), so every weight comes from the checkpoint.

        `preprocessor="auto"` (the default) gives the task the folder's own when it has a
        `tokenizer.json`: its tokenizer, its chat template (`tokenizer_config.json` or
        `chat_template.jinja`) and the ids that end a turn (`generation_config.json`), so
        `generate` takes strings and conversations; `None` gives it none."""
        backbone = DecoderBackbone.from_pretrained(folder, strict=strict, **kwargs)
        if isinstance(preprocessor, str) and preprocessor == "auto":
            preprocessor = causal_folder_preprocessor(
                folder, backbone.max_sequence_length, backbone.vocabulary_size
            )
        return cls(backbone, preprocessor=preprocessor)

    def save_pretrained(
        self, folder: str | os.PathLike[str], tokenizer: Any = None, **kwargs: Any
    ) -> None:
        """Writes the backbone in the Hugging Face GPT-2 or Llama layout (`model_type`,
        `max_shard_size`: see `keras_attn.pretrained.save_pretrained`)."""
        save_pretrained(self.backbone, folder, tokenizer=tokenizer, **kwargs)

    def runner(self) -> "Runner":
        """The decoding `keras_attn.decoding.Runner` over this model's cached call."""
        from keras_attn.models.generation import causal_runner

        return causal_runner(self)

    def generate(
        self, prompts: Any, max_new_tokens: int, **kwargs: Any
    ) -> list[list[int]] | list[str] | str:
        """Continues prompts of any lengths; see `keras_attn.models.generate` (id lists,
        `(batch, seq)` arrays or tensors, strings through the model's preprocessor, or
        conversations through its chat template: the assistant's reply as text).

        Keyword arguments: `sampler` ("greedy", "sample" or "beam"), `temperature`, `top_k`,
        `top_p`, `num_beams`, `length_penalty`, `early_stopping`, `no_repeat_ngram_size`,
        `stop_token_ids`, `stop_strings` (text prompts), `seed`, `use_cache`,
        `pad_token_id`. Returns a list with the new ids of each prompt.

        Raises:
            ValueError: the longest prompt plus `max_new_tokens` is past `max_sequence_length`
                (both numbers named).
        """
        from keras_attn.models.generation import generate

        return generate(self, prompts, max_new_tokens, **kwargs)


def backbone_of(
    backbone_class: type[_BackboneT],
    backbone: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> _BackboneT:
    """`backbone` itself (a `backbone_class`), or the `backbone_class` of the arguments given in
    its place (`CausalLM(vocabulary_size, max_sequence_length, ...)`)."""
    if isinstance(backbone, backbone_class):
        if args or kwargs:
            raise ValueError(
                "Pass either a backbone or the arguments to build one, not both. Received: "
                f"backbone={backbone.name!r} and {sorted(kwargs) or list(args)}"
            )
        return backbone
    if backbone is None and "vocabulary_size" not in kwargs:
        raise ValueError(
            f"The task needs a `backbone` (a {backbone_class.__name__}) or the arguments of "
            "one (`vocabulary_size`, `max_sequence_length`, ...). Received: backbone=None"
        )
    if isinstance(backbone, keras.Model):
        raise ValueError(
            f"`backbone` must be a {backbone_class.__name__}. Received: backbone=a "
            f"{type(backbone).__name__} ({backbone.name!r})"
        )
    first = () if backbone is None else (backbone,)
    return backbone_class(*first, *args, **kwargs)


def fresh_inputs(backbone: keras.Model) -> Any:
    """New `keras.Input`s in the structure of `backbone.input` (int32 `(batch, seq)`)."""
    if isinstance(backbone.input, dict):
        return {name: keras.Input((None,), dtype="int32", name=name) for name in backbone.input}
    return keras.Input((None,), dtype="int32", name="token_ids")


# The backbone's constructor arguments, read through the task (`lm.hidden_dim`).
CausalLM.backbone_attributes = frozenset(DecoderBackbone.config_args) | {
    # What the cached call (`keras_attn.models.cached.CachedCausalLM`) runs: the backbone's.
    "token_embedding", "position_embedding", "decoder_blocks", "final_norm",
}  # fmt: skip


def build_causal_lm(vocabulary_size: int, max_sequence_length: int, **kwargs: Any) -> CausalLM:
    """`CausalLM(vocabulary_size, max_sequence_length, **kwargs)`: kept for the functional
    style."""
    return CausalLM(vocabulary_size, max_sequence_length, **kwargs)


def lm_loss(pad_token_id: int | None = 0, label_smoothing: float = 0.0) -> SparseCrossEntropy:
    """Next-token cross-entropy over logits, ignoring targets equal to `pad_token_id`."""
    return SparseCrossEntropy(ignore_class=pad_token_id, label_smoothing=label_smoothing)


register_model_class("DecoderBackbone", DecoderBackbone)


def causal_folder_preprocessor(
    folder: str | os.PathLike[str], sequence_length: int, vocabulary_size: int
) -> Any:
    """A `CausalLMPreprocessor` for a folder with a `tokenizer.json` (None without one): its
    tokenizer, a packer that starts rows as the tokenizer's post-processor does, and the
    folder's chat template, special tokens and end-of-turn ids."""
    # Deferred: the preprocessing and tokenizers run in TensorFlow, which `import keras_attn`
    # does not load (the JAX and PyTorch backends need none).
    from keras_attn.preprocessing import CausalLMPreprocessor, StartEndPacker
    from keras_attn.tokenizers import from_tokenizer_json
    from keras_attn.tokenizers.loading import single_text_ids
    from keras_attn.tokenizers.pipeline import read_json_file

    path = os.path.join(os.fspath(folder), "tokenizer.json")
    if not os.path.exists(path):
        return None
    spec = read_json_file(path, "folder")
    tokenizer = from_tokenizer_json(spec)
    packer = StartEndPacker(sequence_length, start_value=single_text_ids(spec)[0])
    return CausalLMPreprocessor(tokenizer, packer, **folder_chat(folder, vocabulary_size))
