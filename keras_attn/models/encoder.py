"""BERT-style encoder: token + position + segment embeddings, then Transformer encoder blocks."""

import os
from typing import Any, Self

import keras
from keras import ops

from keras_attn.checks import (
    check_choice,
    check_non_negative_ints,
    check_positive_ints,
    check_rate,
)
from keras_attn.layers.embeddings import TokenEmbedding
from keras_attn.layers.token_and_position_embedding import (
    POSITION_ENCODINGS,
    TokenAndPositionEmbedding,
)
from keras_attn.layers.transformer_encoder import TransformerEncoder
from keras_attn.models.backbone import Backbone
from keras_attn.pretrained import load_pretrained, read_pooling
from keras_attn.pretrained.registry import register_model_class
from keras_attn.types import Tensor


@keras.saving.register_keras_serializable(package="keras_attn")
class EncoderBackbone(Backbone):
    """BERT-style encoder, the backbone the encoder tasks sit on (`Encoder` for short).

    Inputs are a dict: `token_ids (batch, seq)` int32, id 0 = padding, and with
    `num_segments`, `segment_ids (batch, seq)`. The padding mask comes from the token ids
    (`mask_zero`) and reaches every block by mask propagation. Outputs are a dict:
    `sequence_output (batch, seq, hidden_dim)`, and `pooled_output (batch, hidden_dim)`, the
    first ([CLS]) position through a tanh Dense layer, as BERT's pooler.

    Args:
        vocabulary_size: int.
        max_sequence_length: int. Size of the learned position table. Defaults to `128`.
        hidden_dim: int. Defaults to `128`.
        num_layers: int. Defaults to `2`.
        num_heads: int. Defaults to `4`.
        intermediate_dim: int. Feed-forward width; defaults to `4 * hidden_dim`.
        dropout: float. Defaults to `0.1`.
        num_segments: int or None. Segment (sentence A/B) embeddings. Defaults to `2`.
        activation: feed-forward activation. Defaults to `"gelu"`.
        normalize_first: bool. Pre-norm blocks plus a final LayerNorm; BERT is post-norm
            (the default).
        layer_norm_epsilon: float. Defaults to `1e-12` (BERT's).
        position_encoding: `"learned"` (BERT) or `"sinusoidal"`.
        pad_token_id: int. Id of padding: positions holding it are masked. Defaults to `0`
            (BERT, DistilBERT); RoBERTa pads with `1`.
        padding_mask_input: bool. Take the padding mask from an input named `padding_mask`
            (`(batch, seq)`, 1 = real token, Hugging Face's `attention_mask`) instead of from
            the ids. Defaults to `False`.
        position_offset: int. Position of the first token in the position table; RoBERTa's
            tables start at `2`. Defaults to `0`.
        use_pooler: bool. BERT's tanh pooler; without it (DistilBERT) `pooled_output` is the
            first position's hidden state. Defaults to `True`.
        embedding_pooling: optional `{"pooling": "mean" | "cls", "normalize": bool}`: how a
            sentence embedding is made from the outputs (sentence-transformers' pooling,
            which `from_pretrained` reads from the folder); the server's `/embed` uses it
            by default. Defaults to `None` (mean pooling, not normalized).
    Example:
        >>> import numpy as np
        >>> encoder = EncoderBackbone(vocabulary_size=1000, hidden_dim=64)
        >>> ids = np.array([[2, 17, 94, 3, 0], [2, 8, 3, 0, 0]])  # 0 = padding
        >>> segments = np.zeros_like(ids)  # one segment (the default when omitted)
        >>> tuple(encoder({"token_ids": ids, "segment_ids": segments})["pooled_output"].shape)
        (2, 64)
    """

    config_args = (
        "vocabulary_size", "max_sequence_length", "hidden_dim", "num_layers", "num_heads",
        "intermediate_dim", "dropout", "num_segments", "activation", "normalize_first",
        "layer_norm_epsilon", "position_encoding", "pad_token_id", "padding_mask_input",
        "position_offset", "use_pooler", "embedding_pooling",
    )  # fmt: skip

    def __init__(
        self,
        vocabulary_size: int,
        max_sequence_length: int = 128,
        hidden_dim: int = 128,
        num_layers: int = 2,
        num_heads: int = 4,
        intermediate_dim: int | None = None,
        dropout: float = 0.1,
        num_segments: int | None = 2,
        activation: str = "gelu",
        normalize_first: bool = False,
        layer_norm_epsilon: float = 1e-12,
        position_encoding: str = "learned",
        pad_token_id: int = 0,
        padding_mask_input: bool = False,
        position_offset: int = 0,
        use_pooler: bool = True,
        embedding_pooling: dict[str, Any] | None = None,
        name: str = "encoder",
        **kwargs: Any,
    ) -> None:
        check_positive_ints(
            vocabulary_size=vocabulary_size,
            max_sequence_length=max_sequence_length,
            hidden_dim=hidden_dim,
            num_layers=num_layers,
            num_heads=num_heads,
        )
        if num_segments is not None:
            check_positive_ints(num_segments=num_segments)
        check_rate("dropout", dropout)
        check_choice("position_encoding", position_encoding, POSITION_ENCODINGS)
        check_non_negative_ints(pad_token_id=pad_token_id, position_offset=position_offset)
        if embedding_pooling is not None and (
            not isinstance(embedding_pooling, dict)
            or embedding_pooling.get("pooling") not in ("mean", "cls")
            or not isinstance(embedding_pooling.get("normalize"), bool)
            or len(embedding_pooling) != 2
        ):
            raise ValueError(
                '`embedding_pooling` must be None or {"pooling": "mean" | "cls", "normalize": '
                f"bool}}. Received: embedding_pooling={embedding_pooling!r}"
            )
        token_ids = keras.Input((None,), dtype="int32", name="token_ids")
        inputs = {"token_ids": token_ids}
        # BERT's padding (id 0, no mask input) travels by Keras mask propagation; any other
        # rule computes the mask once and hands it to every block.
        mask_zero = pad_token_id == 0 and not padding_mask_input
        embeddings = TokenAndPositionEmbedding(
            vocabulary_size,
            max_sequence_length,
            hidden_dim,
            num_segments=num_segments,
            position_encoding=position_encoding,
            mask_zero=mask_zero,
            use_layer_norm=True,
            layer_norm_epsilon=layer_norm_epsilon,
            dropout=dropout,
            name="embeddings",
        )
        if num_segments:
            inputs["segment_ids"] = keras.Input((None,), dtype="int32", name="segment_ids")
        if padding_mask_input:
            inputs["padding_mask"] = keras.Input((None,), dtype="int32", name="padding_mask")
        segments = (inputs["segment_ids"],) if num_segments else ()
        x = embeddings(token_ids, *segments, start_index=position_offset)
        block_kwargs = {}
        if not mask_zero:
            block_kwargs["padding_mask"] = padding_of(inputs, pad_token_id)
        blocks = [
            TransformerEncoder(
                num_heads=num_heads,
                intermediate_dim=intermediate_dim or 4 * hidden_dim,
                dropout=dropout,
                activation=activation,
                normalize_first=normalize_first,
                layer_norm_epsilon=layer_norm_epsilon,
                name=f"encoder_block_{i}",
            )
            for i in range(num_layers)
        ]
        for block in blocks:
            x = block(x, **block_kwargs)
        final_norm = None
        if normalize_first:
            final_norm = keras.layers.LayerNormalization(
                epsilon=layer_norm_epsilon, name="final_layer_norm"
            )
            x = final_norm(x)
        pooled = x[:, 0]
        if use_pooler:
            pooled = keras.layers.Dense(hidden_dim, activation="tanh", name="pooler")(pooled)
        outputs = {"sequence_output": x, "pooled_output": pooled}
        super().__init__(inputs, outputs, name=name, **kwargs)
        self._set_config_args(locals())
        self.embeddings, self.encoder_blocks, self.final_norm = embeddings, blocks, final_norm

    def call_with_attention_scores(
        self, inputs: dict[str, Tensor]
    ) -> tuple[Tensor, dict[str, dict[str, Tensor]]]:
        """`(sequence_output, {block name: {"self": (batch, heads, T, T)}})` for a dict of
        inputs built like this encoder's."""
        inputs = {key: ops.convert_to_tensor(value) for key, value in inputs.items()}
        segments = (inputs["segment_ids"],) if "segment_ids" in inputs else ()
        x = self.embeddings(inputs["token_ids"], *segments, start_index=self.position_offset)
        mask, maps = self.padding_mask(inputs), {}
        for block in self.encoder_blocks:
            x, weights = block(x, padding_mask=mask, return_attention_scores=True)
            maps[block.name] = {"self": weights}
        return (self.final_norm(x) if self.final_norm is not None else x), maps

    def padding_mask(self, inputs: dict[str, Tensor]) -> Tensor:
        """Bool `(batch, seq)` padding mask (`True` = real token) of a dict of inputs built
        like this encoder's, by its rule (`padding_mask` input, or ids against `pad_token_id`)."""
        return padding_of(inputs, self.pad_token_id)

    @classmethod
    def from_pretrained(
        cls, folder: str | os.PathLike[str], strict: bool = True, **kwargs: Any
    ) -> Self:
        """An encoder with the weights of a Hugging Face folder (`config.json`,
        `model.safetensors`): BERT, MiniLM, sentence-transformers, RoBERTa or DistilBERT.

        `kwargs` override the constructor arguments read from `config.json` (`dropout`, …);
        see `keras_attn.pretrained.load_pretrained`.
        """
        pooling = read_pooling(folder)
        if pooling is not None and pooling["pooling"] in ("mean", "cls"):
            kwargs.setdefault("embedding_pooling", pooling)
        return load_pretrained(folder, cls, strict=strict, **kwargs)

    @property
    def token_embedding(self) -> TokenEmbedding:
        """The `TokenEmbedding` layer (a masked-LM head ties its output projection to it)."""
        return self.embeddings.token_embedding


def padding_of(inputs: dict[str, Tensor], pad_token_id: int = 0) -> Tensor:
    """Bool padding mask of a dict of encoder inputs: its `padding_mask` input when it has one,
    else `token_ids != pad_token_id`."""
    if "padding_mask" in inputs:
        return ops.cast(inputs["padding_mask"], "bool")
    return ops.not_equal(inputs["token_ids"], pad_token_id)


def encoder_inputs(encoder: keras.Model, leading_shape: tuple[int, ...] = ()) -> dict[str, Tensor]:
    """Fresh `keras.Input`s matching `encoder`'s inputs, with extra leading axes (choices)."""
    return {
        name: keras.Input((*leading_shape, None), dtype="int32", name=name)
        for name in encoder.input
    }


Encoder = EncoderBackbone
# Configs written before the backbone/task split name the class "Encoder" (the layout of its
# weights is unchanged).
keras.saving.get_custom_objects()["keras_attn>Encoder"] = EncoderBackbone
register_model_class("EncoderBackbone", EncoderBackbone)
