"""Attention and Transformer layers."""

from keras_attn.layers.attention import Attention, attend
from keras_attn.layers.embeddings import (
    PositionEmbedding,
    SegmentEmbedding,
    SinusoidalPositionEncoding,
    TokenEmbedding,
    sinusoidal_encoding,
)
from keras_attn.layers.feed_forward import FeedForward, gelu, gelu_tanh
from keras_attn.layers.masks import (
    causal_mask,
    mask_value,
    masked_softmax,
    merge_masks,
    padding_mask_to_attention_mask,
)
from keras_attn.layers.multi_head_attention import MultiHeadAttention
from keras_attn.layers.relative_position_bias import RelativePositionBias
from keras_attn.layers.rotary_embedding import RotaryEmbedding
from keras_attn.layers.scores import (
    AdditiveScore,
    BilinearScore,
    DotScore,
    ScaledDotScore,
    Score,
    get_score,
)
from keras_attn.layers.token_and_position_embedding import TokenAndPositionEmbedding
from keras_attn.layers.transformer_decoder import TransformerDecoder
from keras_attn.layers.transformer_encoder import TransformerEncoder

__all__ = [
    "AdditiveScore",
    "Attention",
    "BilinearScore",
    "DotScore",
    "FeedForward",
    "MultiHeadAttention",
    "PositionEmbedding",
    "RelativePositionBias",
    "RotaryEmbedding",
    "ScaledDotScore",
    "Score",
    "SegmentEmbedding",
    "SinusoidalPositionEncoding",
    "TokenAndPositionEmbedding",
    "TokenEmbedding",
    "TransformerDecoder",
    "TransformerEncoder",
    "attend",
    "causal_mask",
    "gelu",
    "gelu_tanh",
    "get_score",
    "mask_value",
    "masked_softmax",
    "merge_masks",
    "padding_mask_to_attention_mask",
    "sinusoidal_encoding",
]
