import numpy as np
import pytest
import tensorflow as tf

from keras_attn.tokenizers import SPECIAL_TOKENS, ByteTokenizer, UnicodeCharTokenizer

pytestmark = pytest.mark.tf_only
S = len(SPECIAL_TOKENS)


def test_byte_tokenizer_pinned_ids_and_exact_round_trip():
    tok = ByteTokenizer()
    assert tok.tokenize("hé").numpy().tolist() == [104 + S, 0xC3 + S, 0xA9 + S]
    texts = ["hello", "héllo wörld", "日本語", "emoji 🙂", ""]
    ids = tok.tokenize(texts)
    assert [t.decode("utf-8") for t in tok.detokenize(ids).numpy()] == texts
    assert tok.vocabulary_size() == 256 + S


def test_byte_tokenizer_keeps_invalid_utf8_bytes():
    raw = b"ok\xff\xfe"
    tok = ByteTokenizer()
    ids = tok.tokenize(tf.constant([raw]))
    assert ids.to_list() == [[ord("o") + S, ord("k") + S, 0xFF + S, 0xFE + S]]
    assert tok.detokenize(ids).numpy().tolist() == [raw]


def test_byte_tokenizer_lookups_and_padding():
    tok = ByteTokenizer(sequence_length=4, lowercase=True)
    np.testing.assert_array_equal(tok.tokenize(["AB"]).numpy(), [[97 + S, 98 + S, 0, 0]])
    assert tok.id_to_token(97 + S) == b"a" and tok.id_to_token(0) == "[PAD]"
    assert tok.token_to_id("a") == 97 + S and tok.token_to_id("[EOS]") == 6
    with pytest.raises(ValueError, match="token"):
        tok.token_to_id("ab")


def test_unicode_char_tokenizer_pinned_ids_and_round_trip():
    tok = UnicodeCharTokenizer()
    assert tok.tokenize("aé日").numpy().tolist() == [97 + S, 0xE9 + S, 0x65E5 + S]
    texts = ["héllo", "日本語 text", ""]
    out = tok.detokenize(tok.tokenize(texts)).numpy()
    assert [t.decode("utf-8") for t in out] == texts


def test_unicode_char_tokenizer_unknowns_normalization_and_bad_bytes():
    ascii_only = UnicodeCharTokenizer(vocabulary_size=128 + S)
    assert ascii_only.tokenize("aé").numpy().tolist() == [97 + S, 1]  # é -> [UNK]
    nfd = UnicodeCharTokenizer(normalization_form="NFD", lowercase=True)
    assert nfd.tokenize("É").numpy().tolist() == [ord("e") + S, 0x301 + S]
    ids = UnicodeCharTokenizer().tokenize(tf.constant([b"a\xffb"])).to_list()
    assert ids == [[97 + S, 0xFFFD + S, 98 + S]]  # invalid byte -> U+FFFD


@pytest.mark.parametrize("tok", [ByteTokenizer(), UnicodeCharTokenizer()])
def test_usable_in_dataset_map_and_with_empty_and_long_strings(tok):
    ds = tf.data.Dataset.from_tensor_slices(["ab", "", "  "]).map(tok)
    assert [len(x) for x in ds.as_numpy_iterator()] == [2, 0, 2]
    long = "x" * 1_000_000
    assert tok.tokenize(long).shape == (1_000_000,)
    with pytest.raises(ValueError, match="ids"):
        tok.detokenize([[tok.vocabulary_size()]])
    with pytest.raises(ValueError, match="strings"):
        tok.tokenize(tf.constant([1, 2]))


def test_bad_arguments():
    with pytest.raises(ValueError, match="vocabulary_size"):
        UnicodeCharTokenizer(vocabulary_size=3)
    with pytest.raises(ValueError, match="normalization_form"):
        UnicodeCharTokenizer(normalization_form="NFX")
    with pytest.raises(ValueError, match="special_tokens"):
        ByteTokenizer(special_tokens=("[UNK]",))
