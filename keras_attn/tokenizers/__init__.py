"""Tokenizers (tensorflow-text inside; for tf.data and SavedModel graphs, under any backend)."""

from keras_attn.tokenizers.base import SPECIAL_TOKENS, Tokenizer
from keras_attn.tokenizers.byte import ByteTokenizer
from keras_attn.tokenizers.sentencepiece import SentencePieceTokenizer, train_sentencepiece
from keras_attn.tokenizers.unicode_char import UnicodeCharTokenizer
from keras_attn.tokenizers.wordpiece import WordPieceTokenizer, train_wordpiece_vocabulary

__all__ = [
    "SPECIAL_TOKENS",
    "ByteTokenizer",
    "SentencePieceTokenizer",
    "Tokenizer",
    "UnicodeCharTokenizer",
    "WordPieceTokenizer",
    "train_sentencepiece",
    "train_wordpiece_vocabulary",
]
