import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_attn.data import load_corpus
from keras_attn.tokenizers import SPECIAL_TOKENS, WordPieceTokenizer, train_wordpiece_vocabulary

pytestmark = pytest.mark.tf_only

VOCAB = [*SPECIAL_TOKENS, "hello", "world", "!", "the", "##s", "cafe", "un", "##known", "Hello"]


def test_pinned_ids_and_wordpiece_splits():
    tok = WordPieceTokenizer(VOCAB)
    ids = tok.tokenize(["Hello world!", "the worlds", "unknown", "zebra"])
    assert ids.to_list() == [[7, 8, 9], [10, 8, 11], [13, 14], [1]]  # [UNK] = 1


def test_bert_normalization_lowercases_and_strips_accents():
    tok = WordPieceTokenizer(VOCAB)
    assert tok.tokenize("CAFÉ").numpy().tolist() == [12]
    cased = WordPieceTokenizer(VOCAB, lowercase=False)
    assert cased.tokenize("Hello hello").numpy().tolist() == [15, 7]
    assert cased.tokenize("CAFÉ").numpy().tolist() == [1]


def test_dense_output_pads_and_truncates_with_zero():
    tok = WordPieceTokenizer(VOCAB, sequence_length=3)
    out = tok.tokenize(["hello", "hello world ! the"]).numpy()
    np.testing.assert_array_equal(out, [[7, 0, 0], [7, 8, 9]])


def test_detokenize_round_trip_and_lookups():
    tok = WordPieceTokenizer(VOCAB)
    ids = tok.tokenize(["Hello worlds!"])
    assert tok.detokenize(ids).numpy().tolist() == [b"hello worlds !"]
    padded = np.array([[7, 8, 0, 0]])  # padding is dropped
    assert tok.detokenize(padded).numpy().tolist() == [b"hello world"]
    assert tok.id_to_token(11) == "##s" and tok.token_to_id("[MASK]") == 4
    assert tok.vocabulary_size() == len(VOCAB) and tok.get_vocabulary() == VOCAB


def test_usable_in_dataset_map():
    tok = WordPieceTokenizer(VOCAB, sequence_length=4)
    ds = tf.data.Dataset.from_tensor_slices(["hello world", "the"]).batch(2).map(tok)
    np.testing.assert_array_equal(next(iter(ds)).numpy(), [[7, 8, 0, 0], [10, 0, 0, 0]])


def test_vocabulary_from_file(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    assert WordPieceTokenizer(str(path)).tokenize("hello").numpy().tolist() == [7]


def test_train_vocabulary_from_strings_and_dataset():
    lines = ["the cat sat on the mat", "the dog sat on the log"] * 50
    vocab = train_wordpiece_vocabulary(lines, 60)
    assert vocab[: len(SPECIAL_TOKENS)] == list(SPECIAL_TOKENS)
    assert {"the", "sat", "on"} <= set(vocab) and len(vocab) <= 60
    from_ds = train_wordpiece_vocabulary(tf.data.Dataset.from_tensor_slices(lines), 60)
    assert from_ds == vocab
    tok = WordPieceTokenizer(vocab)
    assert 1 not in tok.tokenize("the cat sat").numpy().tolist()  # no [UNK]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"vocabulary": ["a", "b"]}, "PAD"),
        ({"vocabulary": ["[PAD]", "[UNK]"], "special_tokens": ("[PAD]", "[CLS]")}, "CLS"),
        ({"vocabulary": [*SPECIAL_TOKENS, "a", "a"]}, "duplicate"),
        ({"vocabulary": "/nonexistent/vocab.txt"}, "vocabulary"),
        ({"sequence_length": 0}, "sequence_length"),
        ({"special_tokens": ("[UNK]", "[PAD]")}, "special_tokens"),
        ({"special_tokens": ("[PAD]", "[PAD]")}, "duplicates"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        WordPieceTokenizer(**kwargs)


def test_bad_inputs():
    tok = WordPieceTokenizer(VOCAB)
    with pytest.raises(ValueError, match="ids"):
        tok.detokenize(np.array([[7, 99]]))
    with pytest.raises(ValueError, match="token_id"):
        tok.id_to_token(-1)
    with pytest.raises(ValueError, match="vocabulary"):
        WordPieceTokenizer().tokenize("hello")
    with pytest.raises(ValueError, match="vocabulary_size"):
        train_wordpiece_vocabulary(["a b"], 3)


_LOAD = """
import sys, numpy as np, keras, tensorflow as tf
import keras_attn  # noqa: F401  registers every class of ours, tokenizers included
model = keras.saving.load_model(sys.argv[1])
print("IDS", model.layers[1].tokenize(["hello worlds"]).numpy().tolist())
print("OUT", float(np.asarray(model(tf.constant(["hello world"]))).sum()))
"""


def _tokenizers_to_save():
    from keras_attn.tokenizers import (
        ByteTokenizer,
        SentencePieceTokenizer,
        UnicodeCharTokenizer,
        train_sentencepiece,
    )

    lines = ["hello world", "hello worlds", "the world"] * 30
    return {
        "wordpiece": WordPieceTokenizer(VOCAB, sequence_length=4),
        "sentencepiece": SentencePieceTokenizer(
            train_sentencepiece(lines, 30, model_type="bpe"), sequence_length=4
        ),
        "byte": ByteTokenizer(sequence_length=4),
        "char": UnicodeCharTokenizer(vocabulary_size=300, sequence_length=4),
    }


@pytest.mark.parametrize("kind", ["wordpiece", "sentencepiece", "byte", "char"])
def test_tokenizer_travels_in_keras_archive_fresh_process(tmp_path, kind):
    import keras_attn as ka

    tok = _tokenizers_to_save()[kind]
    text = keras.Input((), dtype="string")
    out = ka.TokenEmbedding(tok.vocabulary_size(), 3)(tok(text))
    model = keras.Model(text, out)
    expected = float(np.asarray(model(tf.constant(["hello world"]))).sum())
    expected_ids = tok.tokenize(["hello worlds"]).numpy().tolist()
    model.save(tmp_path / "m.keras")
    proc = subprocess.run(
        [sys.executable, "-c", _LOAD, str(tmp_path / "m.keras")],
        capture_output=True,
        text=True,
        env={**os.environ},
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"IDS {expected_ids}" in proc.stdout
    out_line = next(li for li in proc.stdout.splitlines() if li.startswith("OUT"))
    assert float(out_line.split()[1]) == pytest.approx(expected, abs=1e-6)


_JAX_MAP = """
import keras, tensorflow as tf
from keras_attn.preprocessing import StartEndPacker
from keras_attn.tokenizers import SPECIAL_TOKENS, WordPieceTokenizer
tok = WordPieceTokenizer(list(SPECIAL_TOKENS) + ["hello", "world"])
packer = StartEndPacker(5, start_value=5, end_value=6)
ds = tf.data.Dataset.from_tensor_slices(["hello world", "world"]).batch(2).map(tok).map(packer)
print("BACKEND", keras.backend.backend(), next(iter(ds)).numpy().tolist())
"""


def test_dataset_map_works_under_the_jax_backend():
    pytest.importorskip("jax")
    proc = subprocess.run(
        [sys.executable, "-c", _JAX_MAP],
        capture_output=True,
        text=True,
        env={**os.environ, "KERAS_BACKEND": "jax"},
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "BACKEND jax [[5, 7, 8, 6, 0], [5, 8, 6, 0, 0]]" in proc.stdout


def test_serving_tokenizer_matches_tf_text_on_the_corpus():
    """`tokenizers` (Rust, no TensorFlow) gives the same ids as tf-text on corpus lines."""
    from keras_attn_serving.tokenizer import WordPieceTextTokenizer

    lines = load_corpus().lines()[:3000]
    assert len(lines) >= 1000
    vocab = train_wordpiece_vocabulary(lines, 1500)
    ours = WordPieceTokenizer(vocab).tokenize(lines).to_list()
    theirs = WordPieceTextTokenizer(vocab, special_tokens=SPECIAL_TOKENS).encode(lines)
    mismatches = [line for line, a, b in zip(lines, ours, theirs, strict=True) if a != b]
    assert mismatches == []
