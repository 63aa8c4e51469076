"""Embedded text corpora: nothing is downloaded at run time."""

from keras_attn.data.checkpoints import checkpoint_folder
from keras_attn.data.corpus import Corpus, load_corpus
from keras_attn.data.dates import date_arrays, make_dates
from keras_attn.data.labeled import SENTIMENTS, load_ner, load_tweet_sentiment
from keras_attn.data.language_modeling import lm_windows

__all__ = [
    "SENTIMENTS",
    "Corpus",
    "checkpoint_folder",
    "date_arrays",
    "lm_windows",
    "load_corpus",
    "load_ner",
    "load_tweet_sentiment",
    "make_dates",
]
