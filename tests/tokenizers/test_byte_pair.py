"""BytePairTokenizer and UnigramTokenizer: merges and lookahead splits pinned by hand, the
files users have (vocab.json + merges.txt, tokenizer.json), unsupported parts named, and an
exported model serving the same tokens it was trained on (issue 27)."""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from tokenizers import Tokenizer

from keras_attn.tokenizers import BytePairTokenizer, UnigramTokenizer, from_tokenizer_json
from keras_attn.tokenizers.bpe_ops import re2_pattern, split_words
from keras_attn.tokenizers.byte_pair import GPT2_PATTERN, LLAMA3_PATTERN
from tests.conftest import TOY_TEXT
from tests.tokenizers.json_cases import mixed_lines, trained

pytestmark = pytest.mark.tf_only
VOCAB = {"a": 0, "b": 1, "Ġ": 2, "ab": 3, "Ġab": 4, "aa": 5, "<|endoftext|>": 6}


@pytest.fixture(scope="module")
def gpt2_spec():
    return trained("gpt2", mixed_lines(1500, seed=3) + TOY_TEXT * 20)


def _without(line, tokens):
    for token in tokens:
        line = line.replace(token, "")
    return line


def test_merges_pinned_by_hand():
    tok = BytePairTokenizer(VOCAB, ["a b", "Ġ ab", "a a"], special_tokens=["<|endoftext|>"])
    assert tok.tokenize(["ab ab", "aaa", "ba", "ab<|endoftext|>ab"]).to_list() == [
        [3, 4],  # a b → ab; Ġ ab → Ġab
        [5, 0],  # a a a: one pair merges, left first, no overlap
        [1, 0],  # no merge for "b a"
        [3, 6, 3],  # the special token is matched whole, the text around it apart
    ]
    assert tok.detokenize([[3, 4, 6]]).numpy().tolist() == [b"ab ab"]  # specials dropped
    assert tok.token_to_id("Ġab") == 4 and tok.id_to_token(5) == "aa"


@pytest.mark.parametrize(
    ("pattern", "text", "words"),
    [
        # GPT-2's `\s+(?!\S)`: a run gives its last space to the next word.
        (GPT2_PATTERN, "a   b", ["a", "  ", " b"]),
        (GPT2_PATTERN, "a\t\tb", ["a", "\t", "\t", "b"]),
        (GPT2_PATTERN, "x  \n  y", ["x", "  \n ", " y"]),
        (GPT2_PATTERN, "a\n\nb", ["a", "\n", "\n", "b"]),
        (GPT2_PATTERN, "it's  I'LL", ["it", "'s", " ", " I", "'", "LL"]),
        # Llama 3: `\s*[\r\n]+` keeps a run up to its last newline; contractions ignore case.
        (LLAMA3_PATTERN, "a\n\nb", ["a", "\n\n", "b"]),
        (LLAMA3_PATTERN, "x  \n  y", ["x", "  \n", " ", " y"]),
        (LLAMA3_PATTERN, "I'LL 12345", ["I", "'LL", " ", "123", "45"]),
        (LLAMA3_PATTERN, "a\u3000\u3000b", ["a", "\u3000", "\u3000b"]),
    ],
)
def test_pre_tokenizing_lookahead_reproduced_without_lookahead(pattern, text, words):
    regex, cut = re2_pattern(pattern)
    got = split_words(tf.constant([text]), regex, cut).to_list()[0]
    assert [w.decode() for w in got] == words


def test_a_nul_character_does_not_end_the_text(gpt2_spec):
    tok = from_tokenizer_json(gpt2_spec)
    reference = Tokenizer.from_str(json.dumps(gpt2_spec))
    text = "to be\x00or not\x00"
    ids = tok.tokenize([text]).to_list()[0]
    assert ids == reference.encode(text, add_special_tokens=False).ids
    assert tok.detokenize([ids]).numpy()[0].decode() == text


def test_byte_level_round_trip_is_exact(gpt2_spec):
    tok = from_tokenizer_json(gpt2_spec)
    lines = mixed_lines(300, seed=11)
    back = tok.detokenize(tok.tokenize(lines)).numpy()
    specials = ("<|endoftext|>", "</s>", "<s>")  # special tokens: dropped, as by `tokenizers`
    assert [b.decode("utf-8") for b in back] == [_without(line, specials) for line in lines]


def test_vocab_json_and_merges_txt_folder(gpt2_spec, tmp_path):
    reference = Tokenizer.from_str(json.dumps(gpt2_spec))
    reference.model.save(str(tmp_path))  # vocab.json + merges.txt, as GPT-2 ships them
    assert sorted(os.listdir(tmp_path)) == ["merges.txt", "vocab.json"]
    tok = BytePairTokenizer.from_pretrained(tmp_path, sequence_length=12)
    assert tok.special_tokens == ("<|endoftext|>",)
    # The folder knows only `<|endoftext|>` as special: no `<s>` in these lines.
    lines = [_without(line, ("</s>", "<s>")) for line in mixed_lines(200, seed=5)]
    ids = tok.tokenize(lines).numpy()
    want = [e.ids[:12] for e in reference.encode_batch(lines, add_special_tokens=False)]
    assert ids.shape == (200, 12)
    assert [row[: len(w)].tolist() for row, w in zip(ids, want, strict=True)] == want


def test_dataset_map(gpt2_spec):
    tok = from_tokenizer_json(gpt2_spec, sequence_length=6)
    ds = tf.data.Dataset.from_tensor_slices(TOY_TEXT[:4]).batch(2).map(tok)
    got = np.concatenate([batch.numpy() for batch in ds])
    np.testing.assert_array_equal(got, tok.tokenize(TOY_TEXT[:4]).numpy())


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda s: s.update(normalizer={"type": "Strip", "left": True, "right": True}),
         "normalizer 'Strip'"),
        (lambda s: s.update(pre_tokenizer={"type": "Whitespace"}), "pre-tokenizer 'Whitespace'"),
        (lambda s: s.update(decoder={"type": "WordPiece"}), "decoder 'WordPiece'"),
        (lambda s: s.update(pre_tokenizer={"type": "Split", "pattern": {"Regex": "a(?=b)"},
                                           "behavior": "Isolated", "invert": False}),
         "lookaround"),
        (lambda s: s["model"].update(dropout=0.1), "dropout"),
        (lambda s: s["model"].update(type="WordLevel"), "WordPiece, BPE or Unigram"),
    ],
)  # fmt: skip
def test_unsupported_parts_are_named(gpt2_spec, change, match):
    spec = json.loads(json.dumps(gpt2_spec))
    change(spec)
    with pytest.raises(ValueError, match=match):
        from_tokenizer_json(spec)


def test_bad_arguments():
    with pytest.raises(ValueError, match="both `vocabulary` and `merges`"):
        BytePairTokenizer(VOCAB)
    with pytest.raises(ValueError, match="not in the `vocabulary`"):
        BytePairTokenizer(VOCAB, ["a b"], special_tokens=["<s>"])
    with pytest.raises(ValueError, match="no vocabulary"):
        BytePairTokenizer().tokenize(["a"])
    with pytest.raises(ValueError, match="runs BPE models"):
        BytePairTokenizer.from_tokenizer_json(trained("unigram", TOY_TEXT * 5))


_LOAD = """
import sys, numpy as np, keras, tensorflow as tf
import keras_attn  # noqa: F401
model = keras.saving.load_model(sys.argv[1])
print("IDS", model.layers[1].tokenize(["to be or not"]).numpy().tolist())
print("OUT", float(np.asarray(model(tf.constant(["the question"]))).sum()))
"""


@pytest.mark.parametrize("case", ["gpt2", "unigram"])
def test_travels_in_a_keras_archive_to_a_fresh_process(case, tmp_path):
    import keras_attn as ka

    tok = from_tokenizer_json(trained(case, TOY_TEXT * 10), sequence_length=5)
    assert isinstance(tok, BytePairTokenizer if case == "gpt2" else UnigramTokenizer)
    text = keras.Input((), dtype="string")
    model = keras.Model(text, ka.TokenEmbedding(tok.vocabulary_size(), 3)(tok(text)))
    expected = float(np.asarray(model(tf.constant(["the question"]))).sum())
    model.save(tmp_path / "m.keras")
    proc = subprocess.run(
        [sys.executable, "-c", _LOAD, str(tmp_path / "m.keras")],
        capture_output=True, text=True, env={**os.environ}, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"IDS {tok.tokenize(['to be or not']).numpy().tolist()}" in proc.stdout
    out = next(li for li in proc.stdout.splitlines() if li.startswith("OUT"))
    assert float(out.split()[1]) == pytest.approx(expected, abs=1e-6)


def test_exported_lm_serves_the_tokens_it_was_trained_on(gpt2_spec, tmp_path):
    """A causal LM trained on byte-level BPE ids: the SavedModel's `serve_text` and the
    server's tokenizer (no TensorFlow) see the ids Keras saw, and generation returns text."""
    import tensorflow_text  # noqa: F401
    from keras_attn_export import export_model
    from keras_attn_serving import Predictor

    from keras_attn.data import lm_windows
    from keras_attn.models import build_causal_lm, lm_loss

    tok = from_tokenizer_json(gpt2_spec)
    keras.utils.set_random_seed(0)
    x, y = lm_windows([tok.tokenize(t).numpy() for t in TOY_TEXT], 8)
    model = build_causal_lm(tok.vocabulary_size(), 24, hidden_dim=16, num_layers=1, num_heads=2)
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=lm_loss())
    model.fit(x, y, batch_size=8, epochs=2, verbose=0)
    manifest = export_model(model, tmp_path / "lm", tokenizer=tok, strings_in=True, verbose=False)
    assert manifest["parity"]["serve_text_vs_serving_default"] <= 1e-6  # same ids
    assert manifest["text_onnx"]["max_abs_diff"] <= 1e-5
    predictor = Predictor(tmp_path / "lm")
    lines = ["to be or not", "the slings and arrows", "whether tis nobler"]
    assert predictor.tokenizer.encode(lines) == tok.tokenize(lines).to_list()
    loaded = tf.saved_model.load(str(tmp_path / "lm" / "saved_model"))
    from_text = loaded.signatures["serve_text"](text=tf.constant(lines[:1]))["logits"].numpy()
    ids = np.array(tok.tokenize(lines[:1]).to_list(), "int32")
    np.testing.assert_allclose(from_text, model.predict(ids, verbose=0), atol=1e-4)
    # Strings in, logits out, in one ONNX file (GPT2Tokenizer operator), non-ASCII too.
    from keras_attn_export.text_onnx import text_session

    text_onnx = text_session(tmp_path / "lm" / "model.text.onnx")
    for line in ("whether tis nobler <|endoftext|> in the mind", "café, Łódź: 日本語 🙂"):
        ids = np.array(tok.tokenize([line]).to_list(), "int32")[:, :24]
        got = text_onnx.run(["logits"], {"text": np.array([line])})[0]
        np.testing.assert_allclose(got, model.predict(ids, verbose=0), atol=1e-4)
    out = predictor.generate(lines[0], max_new_tokens=3)
    assert out.startswith(lines[0]) and len(out) > len(lines[0])
