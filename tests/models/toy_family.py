"""A model family the library has never heard of, added as a user (or the next family) would:
its own layers as attributes, `CachedCausalLM` for the cached call. Decoding, attention maps
and both ONNX decode graphs work for it with no change in `keras_attn/decoding/`,
`keras_attn/visualization.py` or `export/decode_graph.py` (tests/export/test_families.py)."""

import keras

from keras_attn.layers import PositionEmbedding, TokenEmbedding, TransformerDecoder
from keras_attn.models.cached import CachedCausalLM
from keras_attn.models.task import Task, float32_logits


@keras.saving.register_keras_serializable(package="keras_attn_tests")
class ToyDecoderLM(CachedCausalLM, Task):
    """Pre-norm blocks with grouped-query attention (4 query heads, 2 key/value heads),
    learned positions, SiLU feed-forward, an untied output layer."""

    config_args = ("vocabulary_size", "max_sequence_length")

    def __init__(self, vocabulary_size, max_sequence_length, name="toy_lm", **kwargs):
        token_ids = keras.Input((None,), dtype="int32", name="token_ids")
        token_embedding = TokenEmbedding(vocabulary_size, 32, mask_zero=True, name="tokens")
        position_embedding = PositionEmbedding(max_sequence_length, name="positions")
        blocks = [
            TransformerDecoder(num_heads=4, num_key_value_heads=2, intermediate_dim=64,
                               activation="silu", normalize_first=True, name=f"block_{i}")
            for i in range(2)
        ]  # fmt: skip
        final_norm = keras.layers.LayerNormalization(epsilon=1e-5, name="norm")
        head = keras.layers.Dense(vocabulary_size, name="head")
        x = token_embedding(token_ids)
        x = keras.layers.Add()([x, position_embedding(x)])
        for block in blocks:
            x = block(x)
        logits = float32_logits(head(final_norm(x)), "logits")
        super().__init__(token_ids, logits, name=name, **kwargs)
        self._set_config_args(locals())
        self.token_embedding, self.position_embedding = token_embedding, position_embedding
        self.decoder_blocks, self.final_norm, self.head = blocks, final_norm, head
