"""BERT pretraining: a masked-LM head tied to the token embedding, and next-sentence prediction."""

from typing import Any

import keras
import numpy as np
from keras import ops

from keras_attn.checks import check_positive_int
from keras_attn.layers.feed_forward import get_activation
from keras_attn.losses import SparseCrossEntropy
from keras_attn.models.encoder import EncoderBackbone, encoder_inputs
from keras_attn.models.heads import Head
from keras_attn.models.task import float32_logits
from keras_attn.types import Shape, Tensor


@keras.saving.register_keras_serializable(package="keras_attn")
class MaskedLMHead(keras.layers.Layer):
    """The transform BERT applies before predicting masked tokens.

    Gathers the hidden states at `mask_positions`, then Dense → activation → LayerNorm. The
    caller projects the result to vocabulary logits with the token embedding transposed
    (`TokenEmbedding(..., reverse=True)`), so input and output embeddings stay tied.

    Args:
        activation: Defaults to `"gelu"`.
        layer_norm_epsilon: float. Defaults to `1e-12`.
    Call arguments:
        sequence: float `(batch, seq, hidden_dim)`.
        mask_positions: int `(batch, num_predictions)`.
    Returns:
        `(batch, num_predictions, hidden_dim)`.
    """

    def __init__(
        self, activation: str = "gelu", layer_norm_epsilon: float = 1e-12, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        get_activation(activation)  # validates the name
        self.activation = activation
        self.layer_norm_epsilon = layer_norm_epsilon
        self.supports_masking = True  # the padding mask ends here: outputs are per prediction

    def build(self, sequence_shape: Shape, mask_positions_shape: Shape) -> None:
        if len(sequence_shape) != 3 or len(mask_positions_shape) != 2:
            raise ValueError(
                "`sequence` must be (batch, seq, hidden_dim) and `mask_positions` "
                f"(batch, num_predictions). Received: sequence.shape={tuple(sequence_shape)}, "
                f"mask_positions.shape={tuple(mask_positions_shape)}"
            )
        hidden_shape = (sequence_shape[0], mask_positions_shape[1], sequence_shape[-1])
        self.dense = keras.layers.Dense(sequence_shape[-1], dtype=self.dtype_policy, name="dense")
        self.dense.build(hidden_shape)
        self.layer_norm = keras.layers.LayerNormalization(
            epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name="layer_norm"
        )
        self.layer_norm.build(hidden_shape)

    def call(self, sequence: Tensor, mask_positions: Tensor) -> Tensor:
        positions = ops.cast(mask_positions, "int32")[..., None]
        x = ops.take_along_axis(sequence, positions, axis=1)
        x = get_activation(self.activation)(self.dense(x))
        return self.layer_norm(x)

    def compute_mask(
        self, sequence: Tensor, mask_positions: Tensor, mask: Tensor | None = None
    ) -> None:
        return None

    def compute_output_shape(self, sequence_shape: Shape, mask_positions_shape: Shape) -> Shape:
        return (sequence_shape[0], mask_positions_shape[1], sequence_shape[-1])

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "activation": self.activation,
            "layer_norm_epsilon": self.layer_norm_epsilon,
        }


@keras.saving.register_keras_serializable(package="keras_attn")
class LogitBias(keras.layers.Layer):
    """Adds a learned bias `(units,)` to logits (BERT's `cls.predictions.bias` after its tied
    output projection).

    Args:
        units: int. Size of the last axis.
    Call arguments:
        inputs: float `(..., units)`.
    Returns:
        `inputs + bias`, same shape.
    Example:
        >>> tuple(LogitBias(5)(keras.ops.zeros((2, 3, 5))).shape)
        (2, 3, 5)
    """

    def __init__(self, units: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        check_positive_int("units", units)
        self.units = units

    def build(self, inputs_shape: Shape) -> None:
        self.bias = self.add_weight(name="bias", shape=(self.units,), initializer="zeros")

    def call(self, inputs: Tensor) -> Tensor:
        return inputs + ops.cast(self.bias, inputs.dtype)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "units": self.units}


def masked_lm_graph(
    backbone: EncoderBackbone, activation: str, output_name: str, output_bias: bool
) -> tuple[dict[str, Tensor], dict[str, Tensor], Tensor]:
    """`(inputs, backbone outputs, logits)`: the backbone's inputs plus `mask_positions`, and
    float32 masked-LM logits at those positions, tied to the token embedding (plus a bias)."""
    inputs = encoder_inputs(backbone)
    inputs["mask_positions"] = keras.Input((None,), dtype="int32", name="mask_positions")
    outputs = backbone({key: inputs[key] for key in backbone.input})
    hidden = MaskedLMHead(activation, backbone.layer_norm_epsilon, name="mlm_head")(
        outputs["sequence_output"], inputs["mask_positions"]
    )
    logits = backbone.token_embedding(hidden, reverse=True)
    if output_bias:
        logits = LogitBias(backbone.vocabulary_size, name="mlm_output_bias")(logits)
    return inputs, outputs, float32_logits(logits, output_name)


class OutputBiasConfig:
    """Configs written before `output_bias` existed load as they were saved: without one."""

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Any:
        return super().from_config({"output_bias": False, **config})  # type: ignore[misc]


@keras.saving.register_keras_serializable(package="keras_attn")
class MaskedLM(OutputBiasConfig, Head):
    """Masked-LM alone (RoBERTa-style pretraining, or BERT without next-sentence prediction).

    Inputs: the backbone's plus `mask_positions (batch, num_predictions)`. Output: logits
    `(batch, num_predictions, vocab)` at those positions, from BERT's transform and the token
    embedding transposed (tied), plus a bias. With a `MaskedLMPreprocessor`, `fit(strings)`
    masks, packs and weights by itself (and `predict(strings)` masks at random, as in
    training). The default loss ignores targets equal to 0 (unused prediction slots).
    `from_pretrained` loads the checkpoint's masked-LM head too (BERT's `cls.predictions.*`,
    RoBERTa's `lm_head.*`), so its predictions are the checkpoint's.

    Args:
        backbone: an `EncoderBackbone`.
        activation: activation of the masked-LM transform. Defaults to `"gelu"`.
        output_bias: bool. A bias on the vocabulary logits, as BERT's. Defaults to `True`.
    """

    config_args = ("backbone", "activation", "output_bias")
    masked_lm = True
    pretrained_heads = ("mlm",)

    def __init__(
        self,
        backbone: EncoderBackbone,
        activation: str = "gelu",
        output_bias: bool = True,
        name: str | None = None,
        **kwargs: Any,
    ) -> None:
        inputs, _, logits = masked_lm_graph(backbone, activation, "logits", output_bias)
        super().__init__(inputs, logits, name=name or "masked_lm", **kwargs)
        self._set_config_args(locals())

    def default_loss(self) -> SparseCrossEntropy:
        return SparseCrossEntropy(ignore_class=0)

    def fill_mask(
        self, texts: str | list[str], top_k: int = 5, mask_token: str = "[MASK]"
    ) -> list[list[list[tuple[str, float]]]]:
        """The likeliest tokens for each `mask_token` in each text (Hugging Face's fill-mask
        pipeline): per text, per mask in order, `top_k` `(token, probability)` pairs.

        Needs the task's preprocessor (`from_pretrained` of a folder with a vocabulary).
        Raises `ValueError` for a text without `mask_token`, or past the packer's length.
        """
        check_positive_int("top_k", top_k)
        preprocessor = getattr(self, "preprocessor", None)
        if preprocessor is None or preprocessor.packer is None:
            raise ValueError(
                "`fill_mask` needs the task's preprocessor (load it with "
                "`MaskedLM.from_pretrained(folder)` from a folder with a vocabulary)."
            )
        texts = [texts] if isinstance(texts, str) else list(texts)
        tokenizer, packer = preprocessor.tokenizer, preprocessor.packer
        mask_id = tokenizer.token_to_id(mask_token)
        length = packer.sequence_length
        rows = []
        for text in texts:
            parts = str(text).split(mask_token)
            if len(parts) < 2:
                raise ValueError(f"Every text needs a {mask_token}. Received: {text[:80]!r}")
            ids: list[int] = []
            for n, piece in enumerate(tokenizer(parts).to_list()):
                ids += ([mask_id] if n else []) + piece
            ids = [packer.start_value, *ids, packer.end_value]
            if len(ids) > length:
                raise ValueError(
                    f"A text has {len(ids)} tokens with its special ones; the packer takes "
                    f"{length}. Received: {text[:80]!r}"
                )
            rows.append(ids)
        token_ids = np.full((len(rows), length), packer.pad_value, "int32")
        for row, ids in enumerate(rows):
            token_ids[row, : len(ids)] = ids
        masks = [np.flatnonzero(row == mask_id) for row in token_ids]
        positions = np.zeros((len(rows), max(map(len, masks))), "int32")
        for row, found in enumerate(masks):
            positions[row, : len(found)] = found
        features = {"token_ids": token_ids, "segment_ids": np.zeros_like(token_ids),
                    "padding_mask": (token_ids != packer.pad_value).astype("int32"),
                    "mask_positions": positions}  # fmt: skip
        logits = ops.convert_to_numpy(
            self({name: features[name] for name in self.input}, training=False)
        )
        shifted = np.exp(logits - logits.max(-1, keepdims=True))
        probabilities = shifted / shifted.sum(-1, keepdims=True)
        out = []
        for row, found in enumerate(masks):
            per_mask = []
            for n in range(len(found)):
                best = np.argsort(-probabilities[row, n], kind="stable")[:top_k]
                per_mask.append(
                    [(tokenizer.id_to_token(int(i)), float(probabilities[row, n, i])) for i in best]
                )
            out.append(per_mask)
        return out


@keras.saving.register_keras_serializable(package="keras_attn")
class EncoderPretrainer(OutputBiasConfig, Head):
    """Masked-LM and next-sentence prediction trained together (BERT).

    Inputs: the encoder's (`token_ids`, `segment_ids`) plus `mask_positions
    (batch, num_predictions)` from `MaskedLMMaskGenerator`. Outputs: `mlm` logits
    `(batch, num_predictions, vocab)`, tied to the token embedding, and `nsp` logits
    `(batch, 2)` (1 = sentence B follows A) from the pooled output. The default loss is the
    sum of both cross-entropies; `mlm` targets equal to 0 (unused prediction slots) are
    ignored. `from_pretrained` loads a BERT checkpoint's `cls.predictions.*` and
    `cls.seq_relationship.*` (`BertForPreTraining`'s heads).

    Args:
        backbone: an `EncoderBackbone` with `num_segments`.
        activation: activation of the masked-LM transform. Defaults to `"gelu"`.
        output_bias: bool. A bias on the vocabulary logits, as BERT's. Defaults to `True`.
    """

    config_args = ("backbone", "activation", "output_bias")
    pretrained_heads = ("mlm", "nsp")

    def __init__(
        self,
        backbone: EncoderBackbone,
        activation: str = "gelu",
        output_bias: bool = True,
        name: str | None = None,
        **kwargs: Any,
    ) -> None:
        if not backbone.num_segments:
            raise ValueError(
                "Next-sentence prediction needs segment ids: build the encoder with "
                f"`num_segments`. Received: num_segments={backbone.num_segments!r}"
            )
        inputs, outputs, mlm = masked_lm_graph(backbone, activation, "mlm", output_bias)
        nsp = float32_logits(
            keras.layers.Dense(2, name="nsp_head")(outputs["pooled_output"]), "nsp"
        )
        super().__init__(
            inputs, {"mlm": mlm, "nsp": nsp}, name=name or "encoder_pretrainer", **kwargs
        )
        self._set_config_args(locals())

    def default_loss(self) -> dict[str, SparseCrossEntropy]:
        return {"mlm": SparseCrossEntropy(ignore_class=0), "nsp": SparseCrossEntropy()}
