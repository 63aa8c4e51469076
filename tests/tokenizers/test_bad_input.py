"""Documented behaviour on awkward input, for every tokenizer."""

import pytest
import tensorflow as tf

from keras_attn.data import load_corpus
from keras_attn.tokenizers import (
    ByteTokenizer,
    SentencePieceTokenizer,
    UnicodeCharTokenizer,
    WordPieceTokenizer,
    train_sentencepiece,
    train_wordpiece_vocabulary,
)

pytestmark = pytest.mark.tf_only


@pytest.fixture(scope="module")
def tokenizers():
    lines = load_corpus().lines()[:5000]
    return {
        "wordpiece": WordPieceTokenizer(train_wordpiece_vocabulary(lines, 500)),
        "sentencepiece": SentencePieceTokenizer(train_sentencepiece(lines, 500)),
        "byte": ByteTokenizer(),
        "char": UnicodeCharTokenizer(),
    }


NAMES = ["wordpiece", "sentencepiece", "byte", "char"]


@pytest.mark.parametrize("name", NAMES)
def test_empty_and_whitespace_only_strings_give_no_ids(tokenizers, name):
    tok = tokenizers[name]
    ids = tok.tokenize(tf.constant(["", "   \t\n"])).to_list()
    assert ids[0] == []
    if name in ("wordpiece", "sentencepiece"):
        assert ids[1] == []  # whitespace only separates words
    else:
        assert len(ids[1]) == 5  # every byte / character is a token


@pytest.mark.parametrize("name", ["wordpiece", "sentencepiece"])
def test_invalid_utf8_becomes_unknown(tokenizers, name):
    tok = tokenizers[name]
    unk = tok.token_to_id("[UNK]")
    ids = tok.tokenize(tf.constant([b"ok \xff\xfe bad"])).to_list()[0]
    assert unk in ids
    assert tok.tokenize("ok").numpy().tolist() == ids[: len(tok.tokenize("ok").numpy())]


@pytest.mark.parametrize("name", NAMES)
def test_one_megabyte_string(tokenizers, name):
    text = "to be or not " * 80_000  # 1.04 MB
    ids = tokenizers[name].tokenize(text)
    assert ids.shape[0] >= 80_000


@pytest.mark.parametrize("name", NAMES)
def test_detokenize_rejects_ids_out_of_range(tokenizers, name):
    tok = tokenizers[name]
    with pytest.raises(ValueError, match=r"ids.*must be in \[0, "):
        tok.detokenize([[5, tok.vocabulary_size()]])
    with pytest.raises(ValueError, match="ids"):
        tok.detokenize([[-1]])
