"""Tokenizers (tensorflow-text inside; for tf.data and SavedModel graphs, under any backend)."""

from keras_attn.tokenizers.base import SPECIAL_TOKENS, Tokenizer
from keras_attn.tokenizers.byte import ByteTokenizer
from keras_attn.tokenizers.byte_pair import BytePairTokenizer
from keras_attn.tokenizers.loading import from_tokenizer_json
from keras_attn.tokenizers.marian import MarianTokenizer
from keras_attn.tokenizers.sentencepiece import SentencePieceTokenizer, train_sentencepiece
from keras_attn.tokenizers.unicode_char import UnicodeCharTokenizer
from keras_attn.tokenizers.unigram import UnigramTokenizer
from keras_attn.tokenizers.wordpiece import WordPieceTokenizer, train_wordpiece_vocabulary

__all__ = [
    "SPECIAL_TOKENS",
    "BytePairTokenizer",
    "ByteTokenizer",
    "MarianTokenizer",
    "SentencePieceTokenizer",
    "Tokenizer",
    "UnicodeCharTokenizer",
    "UnigramTokenizer",
    "WordPieceTokenizer",
    "from_tokenizer_json",
    "train_sentencepiece",
    "train_wordpiece_vocabulary",
]
