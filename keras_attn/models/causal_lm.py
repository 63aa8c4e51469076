"""GPT-style causal language model: embeddings, decoder blocks, output tied to the embedding."""

import keras
from keras import ops

from keras_attn.checks import check_choice, check_positive_ints, check_rate, check_renamed
from keras_attn.layers.embeddings import TokenEmbedding
from keras_attn.layers.token_and_position_embedding import (
    POSITION_ENCODINGS,
    position_encoding_layer,
)
from keras_attn.layers.transformer_decoder import TransformerDecoder
from keras_attn.losses import SparseCrossEntropy
from keras_attn.models.cached import CachedCausalLM
from keras_attn.models.task import Task, float32_logits
from keras_attn.pretrained import load_pretrained, save_pretrained
from keras_attn.pretrained.registry import register_model_class


@keras.saving.register_keras_serializable(package="keras_attn")
class CausalLM(CachedCausalLM, Task):
    """GPT-style causal LM: `token_ids (batch, seq) int32 -> logits (batch, seq, vocab)`.

    Token id 0 is padding: `mask_zero=True` creates the padding mask, which reaches every
    block by Keras mask propagation and masks padded positions out of the loss. The output
    projection is the token embedding transposed (tied weights), as in GPT-2. Logits are float32
    under mixed precision.

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
        position_encoding: `"learned"` or `"sinusoidal"`.
        mask_zero: bool. Id 0 is padding, masked in attention and in the loss. GPT-2's id 0
            is a real token (`"!"`): there pad on the right, where the causal mask already
            keeps padding out of every real position. Defaults to `True`.
        layer_norm_epsilon: float. Defaults to `1e-5` (GPT-2's).
        padding_mask_input: bool. Inputs become a dict of `token_ids` and `padding_mask`
            (`(batch, seq)`, 1 = real token, Hugging Face's `attention_mask`); positions count
            real tokens only, so left-padded rows give the logits of the unpadded ones.
            Defaults to `False` (ids in, padding from `mask_zero`).
    Example:
        >>> lm = CausalLM(vocabulary_size=100, max_sequence_length=32, hidden_dim=16)
        >>> [len(ids) for ids in lm.generate([[5, 6, 7]], max_new_tokens=4)]  # four new ids
        [4]
    """

    config_args = (
        "vocabulary_size", "max_sequence_length", "hidden_dim", "num_layers", "num_heads",
        "intermediate_dim", "dropout", "normalize_first", "activation", "position_encoding",
        "mask_zero", "layer_norm_epsilon", "padding_mask_input",
    )  # fmt: skip

    def __init__(
        self,
        vocabulary_size,
        max_sequence_length=None,
        hidden_dim=128,
        num_layers=2,
        num_heads=4,
        intermediate_dim=None,
        dropout=0.0,
        normalize_first=True,
        activation="gelu",
        position_encoding="learned",
        mask_zero=True,
        layer_norm_epsilon=1e-5,
        padding_mask_input=False,
        name="causal_lm",
        **kwargs,
    ):
        check_renamed(kwargs, ("sequence_length",))
        check_positive_ints(
            vocabulary_size=vocabulary_size,
            max_sequence_length=max_sequence_length,
            hidden_dim=hidden_dim,
            num_layers=num_layers,
            num_heads=num_heads,
        )
        check_rate("dropout", dropout)
        check_choice("position_encoding", position_encoding, POSITION_ENCODINGS)
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
            name="token_embedding",
        )
        x = token_embedding(token_ids)
        position_embedding = position_encoding_layer(
            position_encoding, max_sequence_length, "position_embedding"
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
                name=f"decoder_block_{i}",
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
        logits = float32_logits(token_embedding(x, reverse=True), "logits")
        super().__init__(inputs, logits, name=name, **kwargs)
        self._set_config_args(locals())
        # What the cached call (`keras_attn.models.cached.CachedCausalLM`) runs.
        self.token_embedding = token_embedding
        self.position_embedding = position_embedding
        self.decoder_blocks = blocks
        self.final_norm = final_norm

    def default_loss(self):
        return lm_loss()

    @classmethod
    def from_pretrained(cls, folder, strict=True, **kwargs):
        """A causal LM with the weights of a Hugging Face GPT-2 folder (`config.json`,
        `model.safetensors`); `kwargs` override constructor arguments. See
        `keras_attn.pretrained.load_pretrained`."""
        return load_pretrained(folder, cls, strict=strict, **kwargs)

    def save_pretrained(self, folder, tokenizer=None):
        """Writes the Hugging Face GPT-2 layout; see `keras_attn.pretrained.save_pretrained`."""
        save_pretrained(self, folder, tokenizer=tokenizer)

    def runner(self):
        """The decoding `keras_attn.decoding.Runner` over this model's cached call."""
        from keras_attn.models.generation import causal_runner

        return causal_runner(self)

    def generate(self, prompts, max_new_tokens, **kwargs):
        """Continues prompts of any lengths; see `keras_attn.models.generate` (id lists,
        `(batch, seq)` arrays or tensors, or strings through the model's preprocessor).

        Keyword arguments: `sampler` ("greedy", "sample" or "beam"), `temperature`, `top_k`,
        `top_p`, `num_beams`, `length_penalty`, `stop_token_ids`, `seed`, `use_cache`,
        `pad_token_id`. Returns a list with the new ids of each prompt.

        Raises:
            ValueError: the longest prompt plus `max_new_tokens` is past `max_sequence_length`
                (both numbers named).
        """
        from keras_attn.models.generation import generate

        return generate(self, prompts, max_new_tokens, **kwargs)


def build_causal_lm(vocabulary_size, max_sequence_length, **kwargs):
    """`CausalLM(vocabulary_size, max_sequence_length, **kwargs)`: kept for the functional
    style."""
    return CausalLM(vocabulary_size, max_sequence_length, **kwargs)


def lm_loss(pad_token_id=0, label_smoothing=0.0):
    """Next-token cross-entropy over logits, ignoring targets equal to `pad_token_id`."""
    return SparseCrossEntropy(ignore_class=pad_token_id, label_smoothing=label_smoothing)


register_model_class("CausalLM", CausalLM)
