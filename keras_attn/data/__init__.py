"""Embedded text corpora: nothing is downloaded at run time."""

from keras_attn.data.corpus import Corpus, load_corpus
from keras_attn.data.language_modeling import lm_windows

__all__ = ["Corpus", "lm_windows", "load_corpus"]
