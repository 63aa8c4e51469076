"""Tokenizers (tensorflow-text inside; for tf.data and SavedModel graphs)."""

from keras_attn.tokenizers.wordpiece import (
    SPECIAL_TOKENS,
    WordPieceTokenizer,
    train_wordpiece_vocabulary,
)

__all__ = ["SPECIAL_TOKENS", "WordPieceTokenizer", "train_wordpiece_vocabulary"]
