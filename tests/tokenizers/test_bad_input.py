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


def _byte_level_json(added=0, split=None):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    if split is not None:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(split), "isolated"), tokenizer.pre_tokenizer]
        )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tokenizer.train_from_iterator(["to be or not to be, that is the question"] * 4, trainer)
    tokenizer.add_tokens([f"<extra_{i}>" for i in range(added)])
    return tokenizer


def test_an_invalid_split_regex_is_refused_at_load_naming_it():
    """Issue 41 item 10: `(` loaded, and failed at the first `tokenize` with a graph error."""
    import json

    from keras_attn.tokenizers import from_tokenizer_json

    spec = json.loads(_byte_level_json(split="a").to_str())
    spec["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {"Regex": "("}
    with pytest.raises(ValueError, match=r"Split pattern '\(' is not a valid regex"):
        from_tokenizer_json(spec)


def test_many_added_tokens_cost_what_one_does(monkeypatch):
    """Issue 41 item 10: the added tokens' pattern was built inside the traced function, where
    autograph converted its loop over every token (10,000 tokens: 52 s for one text). It is
    built once at load; tokenizing never builds it again, and ids equal `tokenizers`'."""
    import json

    from keras_attn.tokenizers import from_tokenizer_json, json_plan

    reference = _byte_level_json(added=5000)
    ours = from_tokenizer_json(json.loads(reference.to_str()))

    def never(*args):
        raise AssertionError("the added tokens' pattern was built again")

    monkeypatch.setattr(json_plan, "added_token_pattern", never)
    for text in ("to be <extra_4321> or not", "<extra_0><extra_4999>question", "plain"):
        assert ours.tokenize(text).numpy().tolist() == reference.encode(text).ids
