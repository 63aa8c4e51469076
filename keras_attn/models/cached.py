"""The cached forward pass of a causal LM, beside the graph it mirrors.

`CausalLM` owns its layers as attributes (`token_embedding`, `position_embedding`,
`decoder_blocks`, `final_norm`, `head`) and gets `init_cache` / `call_with_cache` from
`CachedCausalLM`: only the new tokens go through the blocks, attending over cached keys and
values. Decoding (`keras_attn.decoding`), attention maps and the ONNX decode graphs all call
these; none of them looks a layer up.

A user's functional causal LM made of our layers gets the same methods from
`FunctionalCausalLM`, which reads the layers off the graph once, under a documented contract,
and checks on a probe that they compute the model's logits.
"""

from collections.abc import Iterable

import keras
import numpy as np
from keras import ops

from keras_attn.layers.embeddings import (
    PositionEmbedding,
    SinusoidalPositionEncoding,
    TokenEmbedding,
)
from keras_attn.layers.masks import per_row, row_positions
from keras_attn.layers.token_and_position_embedding import TokenAndPositionEmbedding
from keras_attn.layers.transformer_decoder import TransformerDecoder
from keras_attn.types import Tensor


def empty_caches(
    blocks: Iterable[TransformerDecoder], batch_size: int, max_length: int
) -> list[Tensor]:
    """Zeros for the self-attention keys and values of each decoder block:
    `(batch, 2, max_length, kv_heads, key_dim)` in the block's compute dtype."""
    caches = []
    for block in blocks:
        attention = block.self_attention
        heads = attention.num_key_value_heads or attention.num_heads
        shape = (batch_size, 2, max_length, heads, attention.key_dim)
        caches.append(ops.zeros(shape, dtype=block.compute_dtype))
    return caches


class CachedCausalLM:
    """`init_cache`, `call_with_cache` and `call_with_attention_scores` over the attributes
    `token_embedding`, `position_embedding`, `decoder_blocks`, `final_norm` (or None) and
    `head` (None: the token embedding, transposed)."""

    # Set by the class that mixes this in: its own layers.
    token_embedding: TokenEmbedding
    position_embedding: keras.layers.Layer | None
    decoder_blocks: list[TransformerDecoder]
    final_norm: keras.layers.Layer | None
    head: keras.layers.Layer | None = None

    @property
    def max_length(self) -> int | None:
        """The longest sequence the position table allows (None: sinusoidal, unbounded);
        with rotary positions, the model's `max_sequence_length`."""
        if self.position_embedding is None:
            return getattr(self, "max_sequence_length", None)
        return getattr(self.position_embedding, "sequence_length", None)

    @property
    def zero_is_padding(self) -> bool:
        """Whether id 0 is padding (masked), as the token embedding says."""
        return bool(self.token_embedding.mask_zero)

    def embed(self, token_ids: Tensor, index: int | Tensor = 0) -> Tensor:
        """Embeddings of `token_ids` placed at positions `index, index + 1, …` (`index`: one
        int for every row, or a `(batch,)` tensor, one per row)."""
        x = self.token_embedding(token_ids)
        if self.position_embedding is None:  # rotary: positions are applied in attention
            return x
        if per_row(index):
            positions = row_positions(ops.shape(token_ids)[1], index)
            return x + self.position_embedding(x, position_ids=positions)
        return x + self.position_embedding(x, start_index=index)

    def logits(self, x: Tensor) -> Tensor:
        """float32 logits of the last blocks' output `x`."""
        if self.final_norm is not None:
            x = self.final_norm(x)
        x = self.head(x) if self.head is not None else self.token_embedding(x, reverse=True)
        return ops.cast(x, "float32")

    def init_cache(self, batch_size: int, max_length: int) -> list[Tensor]:
        """An empty key/value cache: per block `(batch, 2, max_length, kv_heads, key_dim)`."""
        return empty_caches(self.decoder_blocks, batch_size, max_length)

    def call_with_cache(
        self, token_ids: Tensor, cache: list[Tensor], cache_update_index: int | Tensor
    ) -> tuple[Tensor, list[Tensor]]:
        """Logits `(batch, new, vocab)` of `token_ids` placed at `cache_update_index`, and the
        cache with their keys and values written in."""
        x = self.embed(token_ids, cache_update_index)
        updated = []
        for block, block_cache in zip(self.decoder_blocks, cache, strict=True):
            x, block_cache = block(
                x, self_attention_cache=block_cache,
                self_attention_cache_update_index=cache_update_index,
            )  # fmt: skip
            updated.append(block_cache)
        return self.logits(x), updated

    def padding(self, token_ids: Tensor) -> Tensor:
        """The padding mask the model's embedding would propagate."""
        if self.zero_is_padding:
            return ops.not_equal(token_ids, 0)
        return ops.ones_like(token_ids, dtype="bool")

    def call_with_attention_scores(
        self, token_ids: Tensor
    ) -> tuple[Tensor, dict[str, dict[str, Tensor]]]:
        """`(logits, {block name: {"self": (batch, heads, T, T)}})` for unpadded ids."""
        token_ids = ops.convert_to_tensor(token_ids)
        x, mask, maps = self.embed(token_ids, 0), self.padding(token_ids), {}
        for block in self.decoder_blocks:
            x, weights = block(x, decoder_padding_mask=mask, return_attention_scores=True)
            maps[block.name] = {"self": weights}
        return self.logits(x), maps


CONTRACT = (
    "a causal LM made of: TokenAndPositionEmbedding (or TokenEmbedding + PositionEmbedding / "
    "SinusoidalPositionEncoding added), TransformerDecoder blocks, optionally one "
    "LayerNormalization, then the tied TokenEmbedding(reverse=True) or one Dense layer"
)


def _of_type(model, types):
    return [layer for layer in model.layers if isinstance(layer, types)]


class FunctionalCausalLM(CachedCausalLM):
    """The cached call of a user's functional causal LM (token ids in, logits out) made of, in
    graph order: (1) one `TokenAndPositionEmbedding`, or one `TokenEmbedding` plus one
    `PositionEmbedding` / `SinusoidalPositionEncoding` added to it; (2) `TransformerDecoder`
    blocks without cross-attention; (3) optionally one `LayerNormalization`; (4) the
    `TokenEmbedding` reversed or one `Dense` layer. Dropout and dtype casts may sit anywhere.
    Anything else would be skipped by cached decoding: the constructor checks that these
    layers alone give the model's logits on a probe, or raises a `ValueError` naming the
    contract."""

    def __init__(self, model: keras.Model, verify: bool = True) -> None:
        combined = _of_type(model, TokenAndPositionEmbedding)
        tokens = _of_type(model, TokenEmbedding)
        positions = _of_type(model, (PositionEmbedding, SinusoidalPositionEncoding))
        self.decoder_blocks = _of_type(model, TransformerDecoder)
        norms = _of_type(model, keras.layers.LayerNormalization)
        heads = _of_type(model, keras.layers.Dense)
        if len(combined) == 1 and not tokens and not positions:
            self._combined, self.position_embedding = combined[0], None
            self.token_embedding = combined[0].token_embedding
        elif not combined and len(tokens) == 1 and len(positions) == 1:
            self._combined, self.position_embedding = None, positions[0]
            self.token_embedding = tokens[0]
        else:
            raise ValueError(f"`model` {model.name!r} is not {CONTRACT}.")
        if not self.decoder_blocks or len(norms) > 1 or len(heads) > 1:
            raise ValueError(f"`model` {model.name!r} is not {CONTRACT}.")
        self.final_norm = norms[0] if norms else None
        self.head = heads[0] if heads else None
        self.model_input = model.input
        if verify:
            self._verify(model)

    @property
    def max_length(self) -> int | None:
        if self._combined is not None:
            learned = self._combined.position_encoding == "learned"
            return self._combined.sequence_length if learned else None
        return getattr(self.position_embedding, "sequence_length", None)

    def embed(self, token_ids: Tensor, index: int | Tensor = 0) -> Tensor:
        if self._combined is not None:
            if per_row(index):
                raise ValueError(
                    "This model's token and position embedding is one layer, which takes one "
                    "position for every row. Received: an index of shape "
                    f"{tuple(getattr(index, 'shape', ()))}"
                )
            return self._combined(token_ids, start_index=index)
        # Named, not `super()`: autograph (tf.function over the decode step) mis-converts
        # zero-argument super() in a method of a subclass.
        return CachedCausalLM.embed(self, token_ids, index)

    def _verify(self, model):
        """The layers run alone must give the model's logits: nothing was skipped."""
        vocabulary = self.token_embedding.vocabulary_size
        length = min(6, self.max_length or 6)
        probe = (np.arange(1, length + 1, dtype="int32") * 7 % (vocabulary - 1) + 1)[None]
        ours = ops.convert_to_numpy(self.call_with_attention_scores(probe)[0])
        logits = model(model_inputs(model, probe), training=False)
        theirs = ops.convert_to_numpy(ops.cast(logits, "float32"))
        if ours.shape != theirs.shape or not np.allclose(ours, theirs, atol=1e-4):
            raise ValueError(
                f"`model` {model.name!r} computes more than its embedding, decoder blocks, final "
                f"norm and output layer: cached decoding needs {CONTRACT}."
            )


def model_inputs(model: keras.Model, token_ids: Tensor) -> Tensor | dict[str, Tensor]:
    """What a causal LM takes for unpadded `token_ids`: the ids, or with a `padding_mask` input
    (`CausalLM(padding_mask_input=True)`) a dict with an all-ones mask."""
    if isinstance(model.input, dict):
        token_ids = ops.convert_to_tensor(token_ids)
        return {"token_ids": token_ids, "padding_mask": ops.ones_like(token_ids)}
    return token_ids


def cached_causal_lm(model: keras.Model) -> CachedCausalLM:
    """`model` itself when it owns its cached call (`CausalLM`), else the `FunctionalCausalLM`
    of a functional model (built and checked once per model)."""
    if isinstance(model, CachedCausalLM):
        return model
    adapter = model.__dict__.get("_keras_attn_cached_lm")
    if adapter is None:
        adapter = FunctionalCausalLM(model)
        object.__setattr__(model, "_keras_attn_cached_lm", adapter)
    return adapter
