"""The layers of a causal language model, found by type: what cached decoding and attention
maps need from a `CausalLM` or from a user's functional model built of our layers.

The contract for a functional causal LM (token ids in, logits `(batch, seq, vocab)` out), in
graph order:
1. embeddings: one `TokenAndPositionEmbedding`, or one `TokenEmbedding` plus one
   `PositionEmbedding` / `SinusoidalPositionEncoding` added to it;
2. `TransformerDecoder` blocks (no cross-attention), each feeding the next;
3. optionally one `LayerNormalization` (pre-norm models' final norm);
4. the output: the `TokenEmbedding` reversed (tied weights) or one `Dense` layer.
Dropout and dtype casts (`Activation("linear")`) may sit anywhere. Anything else between those
layers would be skipped by cached decoding, so `CausalStack` checks: the stack's logits must
equal the model's on a probe, or a `ValueError` names the contract.
"""

import keras
import numpy as np
from keras import ops

from keras_attn.layers.embeddings import (
    PositionEmbedding,
    SinusoidalPositionEncoding,
    TokenEmbedding,
)
from keras_attn.layers.token_and_position_embedding import TokenAndPositionEmbedding
from keras_attn.layers.transformer_decoder import TransformerDecoder

CONTRACT = (
    "a causal LM made of: TokenAndPositionEmbedding (or TokenEmbedding + PositionEmbedding / "
    "SinusoidalPositionEncoding added), TransformerDecoder blocks, optionally one "
    "LayerNormalization, then the tied TokenEmbedding(reverse=True) or one Dense layer"
)


def _of_type(model, types):
    return [layer for layer in model.layers if isinstance(layer, types)]


class CausalStack:
    """Embedding, blocks, final norm and output projection of a causal LM.

    Attributes:
        blocks: the `TransformerDecoder` layers, in order.
        token_embedding: the `TokenEmbedding` (inside the `TokenAndPositionEmbedding` if any).
        positions: the position layer, or None inside a `TokenAndPositionEmbedding`.
        final_norm: the final `LayerNormalization`, or None.
        head: the output `Dense` layer, or None when the token embedding is tied.
        max_length: the longest sequence the position table allows (None: sinusoidal).
        mask_zero: whether id 0 is padding (masked).
    """

    def __init__(self, model, verify=True):
        combined = _of_type(model, TokenAndPositionEmbedding)
        tokens = _of_type(model, TokenEmbedding)
        positions = _of_type(model, (PositionEmbedding, SinusoidalPositionEncoding))
        self.blocks = _of_type(model, TransformerDecoder)
        norms = _of_type(model, keras.layers.LayerNormalization)
        heads = _of_type(model, keras.layers.Dense)
        if combined and not tokens and not positions and len(combined) == 1:
            self._combined, self.positions = combined[0], None
            self.token_embedding = combined[0].token_embedding
            self.max_length = combined[0].sequence_length
        elif not combined and len(tokens) == 1 and len(positions) == 1:
            self._combined, self.positions = None, positions[0]
            self.token_embedding = tokens[0]
            self.max_length = getattr(positions[0], "sequence_length", None)
        else:
            raise ValueError(f"`model` {model.name!r} is not {CONTRACT}.")
        if combined and combined[0].position_encoding != "learned":
            self.max_length = None
        if not self.blocks or len(norms) > 1 or len(heads) > 1:
            raise ValueError(f"`model` {model.name!r} is not {CONTRACT}.")
        self.final_norm = norms[0] if norms else None
        self.head = heads[0] if heads else None
        self.mask_zero = bool(self.token_embedding.mask_zero)
        self.model_input = model.input
        if verify:
            self._verify(model)

    def embed(self, token_ids, index):
        """Embeddings of `token_ids` placed at positions `index, index + 1, …`."""
        if self._combined is not None:
            return self._combined(token_ids, start_index=index)
        x = self.token_embedding(token_ids)
        return x + self.positions(x, start_index=index)

    def logits(self, x):
        """float32 logits of the last hidden states `x` (after the blocks)."""
        if self.final_norm is not None:
            x = self.final_norm(x)
        x = self.head(x) if self.head is not None else self.token_embedding(x, reverse=True)
        return ops.cast(x, "float32")

    def padding(self, token_ids):
        """The padding mask the model's embedding would propagate."""
        if self.mask_zero:
            return ops.not_equal(token_ids, 0)
        return ops.ones_like(token_ids, dtype="bool")

    def model_inputs(self, token_ids):
        """What the model takes for unpadded `token_ids`: the ids, or with a `padding_mask`
        input (`CausalLM(padding_mask_input=True)`) a dict with an all-ones mask."""
        if isinstance(self.model_input, dict):
            token_ids = ops.convert_to_tensor(token_ids)
            return {"token_ids": token_ids, "padding_mask": ops.ones_like(token_ids)}
        return token_ids

    def _verify(self, model):
        """The stack run alone must give the model's logits: nothing was skipped."""
        vocabulary = self.token_embedding.vocabulary_size
        length = min(6, self.max_length or 6)
        probe = (np.arange(1, length + 1, dtype="int32") * 7 % (vocabulary - 1) + 1)[None]
        x = self.embed(ops.convert_to_tensor(probe), 0)
        mask = self.padding(probe)
        for block in self.blocks:
            x = block(x, decoder_padding_mask=mask)
        ours = ops.convert_to_numpy(self.logits(x))
        logits = model(self.model_inputs(probe), training=False)
        theirs = ops.convert_to_numpy(ops.cast(logits, "float32"))
        if ours.shape != theirs.shape or not np.allclose(ours, theirs, atol=1e-4):
            raise ValueError(
                f"`model` {model.name!r} computes more than its embedding, decoder blocks, final "
                f"norm and output layer: cached decoding needs {CONTRACT}."
            )
