"""Marian's tokenizer pair against `transformers.MarianTokenizer`: the server's reader
(`sentencepiece`) on every generated line; the in-graph tokenizer (tensorflow-text's bundled
SentencePiece) on every line without a run of three equal characters, whose tied
segmentations it breaks its own way (measured: 73 of 2,000 generated lines, 0 of 5,000 corpus
lines); decoding; and the files a folder can hold refused by name."""

import io
import json
import re
import warnings

import pytest
import tensorflow as tf
from keras_attn_export.describe import write_tokenizer
from keras_attn_serving.tokenizer import MarianTextTokenizer, load_text_tokenizer

from keras_attn.data import load_corpus
from keras_attn.tokenizers import MarianTokenizer
from tests.tokenizers.json_cases import mixed_lines

spm = pytest.importorskip("sentencepiece")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.tf_only

EXTRA = [">>fr<< hello", ">>xx<<hi", ">><<", "x >>fr<< y", "a</s>>>fr<<b", "<unk>x", " <pad> ",
         "a\x00b c", "", "   "]  # fmt: skip


def _model(lines, size):
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, vocab_size=size, minloglevel=2,
        character_coverage=0.98, hard_vocab_limit=False,
    )  # fmt: skip
    return model.getvalue()


def write_marian_folder(folder, language_code=True):
    """Marian's files in `folder`: source and target models trained on generated lines,
    numbered by one `vocab.json` (with `>>fr<<` when `language_code`)."""
    source, target = _model(mixed_lines(2000, seed=1), 1500), _model(mixed_lines(2000, 2), 1200)
    (folder / "source.spm").write_bytes(source)
    (folder / "target.spm").write_bytes(target)
    vocab = {"</s>": 0, "<unk>": 1}
    for proto in (source, target):
        model = spm.SentencePieceProcessor(model_proto=proto)
        for piece in map(model.id_to_piece, range(model.get_piece_size())):
            if piece not in vocab and piece not in ("<s>", "</s>", "<unk>"):
                vocab[piece] = len(vocab)
    if language_code:
        vocab[">>fr<<"] = len(vocab)
    vocab["<pad>"] = len(vocab)
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_marian_folder(tmp_path_factory.mktemp("marian"))


@pytest.fixture(scope="module")
def reference(folder):
    with warnings.catch_warnings():  # "Recommended: pip install sacremoses" (never used)
        warnings.simplefilter("ignore", UserWarning)
        return transformers.MarianTokenizer.from_pretrained(folder)


def test_ids_equal_marian_tokenizer_in_the_server_and_in_graph(folder, reference, tmp_path):
    lines = [*mixed_lines(2000, seed=3), *load_corpus().lines()[:1000], *EXTRA]
    want = reference(lines, add_special_tokens=False).input_ids
    ours = MarianTokenizer.from_pretrained(folder)
    write_tokenizer(ours, tmp_path / "tokenizer")
    served = load_text_tokenizer(tmp_path / "tokenizer")
    assert isinstance(served, MarianTextTokenizer)
    assert [ln for ln, got, ids in zip(lines, served.encode(lines), want, strict=True)
            if got != ids][:3] == []  # fmt: skip
    in_graph = ours.tokenize(lines).to_list()
    misses = [ln for ln, got, ids in zip(lines, in_graph, want, strict=True) if got != ids]
    assert [ln for ln in misses if not re.search(r"(.)\1\1", ln)][:3] == []
    assert len(misses) < 0.1 * len(lines)
    # The target side cuts labels with target.spm, as `text_target=` does.
    target = MarianTokenizer.from_pretrained(folder, side="target").tokenize(lines[2000:]).to_list()
    assert target == reference(text_target=lines[2000:], add_special_tokens=False).input_ids


def test_decoded_text_equals_marian_tokenizer(folder, reference, tmp_path):
    ids = reference(mixed_lines(300, seed=4) + EXTRA).input_ids
    want = reference.batch_decode(ids, skip_special_tokens=True)
    ours = MarianTokenizer.from_pretrained(folder)
    got = [t.decode("utf-8") for t in ours.detokenize(tf.ragged.constant(ids)).numpy()]
    assert got == want
    write_tokenizer(ours, tmp_path / "tokenizer")
    served = load_text_tokenizer(tmp_path / "tokenizer")
    assert [served.decode(row) for row in ids] == want


def test_bad_marian_folders_are_refused(folder, tmp_path):
    for name in ("source.spm", "target.spm", "vocab.json"):
        (tmp_path / name).write_bytes((folder / name).read_bytes())
    vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
    for bad, message in [
        ("[1, 2]", "map tokens to ids"), ("{bad json", "not valid JSON"),
        (json.dumps({**vocab, "x": 10**9}), "integers in"),
        (json.dumps({**vocab, "x": 0}), "distinct"),
        (json.dumps({k: v for k, v in vocab.items() if k != "<pad>"}), "special tokens"),
    ]:  # fmt: skip
        (tmp_path / "vocab.json").write_text(bad, encoding="utf-8")
        with pytest.raises(ValueError, match=message):
            MarianTokenizer.from_pretrained(tmp_path)
    (tmp_path / "vocab.json").write_bytes((folder / "vocab.json").read_bytes())
    (tmp_path / "source.spm").write_bytes(b"not a model")
    with pytest.raises(ValueError, match="SentencePiece model"):
        MarianTokenizer.from_pretrained(tmp_path)
    (tmp_path / "source.spm").unlink()
    with pytest.raises(ValueError, match="needs 'source"):
        MarianTokenizer.from_pretrained(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text('{"separate_vocabs": true}')
    with pytest.raises(ValueError, match="separate vocabularies"):
        MarianTokenizer.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match="side"):
        MarianTokenizer(side="middle")


def test_bad_served_marian_folders_are_refused_by_name(folder, tmp_path):
    """The server's reader checks what an artifact's tokenizer folder holds: each refusal is
    a ValueError naming the file, never its path."""
    write_tokenizer(MarianTokenizer.from_pretrained(folder), tmp_path / "tokenizer")
    good = {p.name: p.read_bytes() for p in (tmp_path / "tokenizer").iterdir()}
    vocab = json.loads(good["vocab.json"])
    cases = [
        ("vocab.json", json.dumps({**vocab, "x": True}).encode(), "number its tokens"),
        ("vocab.json", json.dumps({**vocab, "x": len(vocab) + 5}).encode(), "number its tokens"),
        ("vocab.json", b"[1]", "number its tokens"),
        ("vocab.json", b"{", "vocab.json is not valid JSON"),
        ("tokenizer.json", b'{"type": "marian", "special_tokens": []}', "special tokens"),
        ("tokenizer.json", b'{"type": "marian", "special_tokens": [[1]]}', "special tokens"),
        ("source.spm", b"", "not a SentencePiece model"),
        ("source.spm", b"garbage", "not a SentencePiece model"),
        ("source.spm", None, "has no source.spm"),
    ]
    for name, data, message in cases:
        target = tmp_path / "tokenizer" / name
        target.unlink()
        if data is not None:
            target.write_bytes(data)
        with pytest.raises(ValueError, match=message) as caught:
            load_text_tokenizer(tmp_path / "tokenizer")
        assert str(tmp_path) not in str(caught.value)
        target.write_bytes(good[name])
    assert load_text_tokenizer(tmp_path / "tokenizer").encode("hello") != []


def test_marian_tokenizer_arguments_are_checked(folder):
    files = [(folder / n).read_bytes() for n in ("source.spm", "target.spm")]
    with pytest.raises(ValueError, match="given together"):
        MarianTokenizer(files[0], None, None)
    with pytest.raises(ValueError, match="must include '<unk>'"):
        MarianTokenizer(special_tokens=("</s>", "<pad>"))
    with pytest.raises(ValueError, match="distinct non-empty"):
        MarianTokenizer(special_tokens=("<unk>", "<unk>"))
    with pytest.raises(ValueError, match="SentencePiece model"):
        MarianTokenizer(files[0], b"garbage", json.loads((folder / "vocab.json").read_text()))
    with pytest.raises(ValueError, match="has no files"):
        MarianTokenizer().save_assets("/nonexistent")
