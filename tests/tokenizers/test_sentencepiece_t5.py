"""T5's `spiece.model` and the `Precompiled` normalizer its `tokenizer.json` carries: the
in-graph tokenizer, the server's reader and `transformers`' `T5Tokenizer` give the same ids
on the same generated lines; the normalizer equals `tokenizers`' on every code point."""

import io
import random
import sys

import pytest
import tensorflow as tf
from keras_attn_export.describe import write_tokenizer
from keras_attn_serving.tokenizer import load_text_tokenizer

from keras_attn.tokenizers import UnigramTokenizer, from_tokenizer_json
from keras_attn.tokenizers.loading import folder_tokenizer_json
from keras_attn.tokenizers.precompiled import precompiled_normalizer, read_charsmap
from keras_attn.tokenizers.spm_convert import (
    read_sentencepiece_model,
    sentencepiece_tokenizer_json,
)
from tests.tokenizers.json_cases import mixed_lines

spm = pytest.importorskip("sentencepiece")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")
pytestmark = pytest.mark.tf_only

# Combining sequences: the clusters that the normalizer replaces whole, or char by char.
MARKS = [
    *map(chr, [*range(0x300, 0x370), *range(0x591, 0x5C8), *range(0x64B, 0x660)]),
    "\u200d",
    "\u200c",
    "\ufe0f",
    "\u20dd",
    "\u3099",
    "\uff9e",
    "\U0001f3fb",
    "\u093f",
]
BASES = [*map(chr, [*range(0x20, 0x7F), *range(0xA0, 0x250), *range(0x370, 0x3FF),
                    *range(0x600, 0x6FF), *range(0xFF01, 0xFFA0)]),
         "\r", "\n", "\u1100", "\uac00", "\u2460", "\u3300", "\U0001f600"]  # fmt: skip


def _train(lines, **kwargs):
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, vocab_size=2000,
        pad_id=0, eos_id=1, unk_id=2, bos_id=-1, minloglevel=2, character_coverage=0.98,
        hard_vocab_limit=False, **{"model_type": "unigram", **kwargs},
    )  # fmt: skip
    return model.getvalue()


@pytest.fixture(scope="module")
def t5_folder(tmp_path_factory):
    """A folder with T5's `spiece.model` only (nmt_nfkc), trained on generated lines."""
    folder = tmp_path_factory.mktemp("t5_spiece")
    (folder / "spiece.model").write_bytes(_train(mixed_lines(3000, seed=5)))
    (folder / "tokenizer_config.json").write_text(
        '{"extra_ids": 7, "tokenizer_class": "T5Tokenizer"}'
    )
    return folder


@pytest.fixture(scope="module")
def charsmap(t5_folder):
    return read_sentencepiece_model(t5_folder / "spiece.model").normalizer_spec.precompiled_charsmap


def test_normalizer_equals_tokenizers_on_every_code_point(charsmap):
    reference = tokenizers.normalizers.Precompiled(charsmap)
    chars = [chr(c) for c in range(1, sys.maxunicode + 1) if not 0xD800 <= c <= 0xDFFF]
    ours = precompiled_normalizer(charsmap)(tf.constant(chars)).numpy()
    misses = [(hex(ord(c)), o) for c, o in zip(chars, ours, strict=True)
              if o.decode("utf-8") != reference.normalize_str(c)]  # fmt: skip
    assert misses[:5] == []
    assert sum(o.decode("utf-8") != c for c, o in zip(chars, ours, strict=True)) > 5000


def test_normalizer_equals_tokenizers_on_combining_sequences(charsmap):
    rng = random.Random(3)

    def cluster():
        return rng.choice(BASES) + "".join(rng.choices(MARKS, k=rng.choice([0, 0, 1, 1, 2, 3])))

    texts = ["".join(cluster() for _ in range(rng.randint(1, 8))) for _ in range(20_000)]
    reference = tokenizers.normalizers.Precompiled(charsmap)
    ours = precompiled_normalizer(charsmap)(tf.constant(texts)).numpy()
    misses = [ascii(t) for t, o in zip(texts, ours, strict=True)
              if o.decode("utf-8") != reference.normalize_str(t)]  # fmt: skip
    assert misses[:5] == []
    # The rule that makes clusters matter: a fullwidth letter takes its accent with it.
    assert reference.normalize_str("\uff21\u0301b") == "Ab"


def test_spiece_ids_equal_t5_tokenizer_in_graph_and_in_the_server(t5_folder, tmp_path):
    reference = transformers.T5Tokenizer.from_pretrained(t5_folder)
    spec = folder_tokenizer_json(t5_folder)
    ours = from_tokenizer_json(spec)
    assert isinstance(ours, UnigramTokenizer)
    write_tokenizer(ours, tmp_path / "tokenizer")
    served = load_text_tokenizer(tmp_path / "tokenizer")

    lines = [*mixed_lines(3000, seed=11), "ＡＢＣ ½ ﬁ ①", "e\u0301 \uff21\u0301", "<extra_id_3>"]
    want = reference(lines, add_special_tokens=False).input_ids
    misses = [line for line, got, ids in zip(lines, ours.tokenize(lines).to_list(), want,
                                             strict=True) if got != ids]  # fmt: skip
    assert misses[:3] == []
    assert [line for line, got, ids in zip(lines, served.encode(lines), want, strict=True)
            if got != ids][:3] == []  # fmt: skip
    # Sentinels as transformers numbers them: <extra_id_0> last; `</s>` ends a single text.
    assert ours.token_to_id("<extra_id_0>") == reference.convert_tokens_to_ids("<extra_id_0>")
    assert ours.vocabulary_size() == len(reference) == 2007
    texts = [t.decode("utf-8") for t in ours.detokenize(tf.ragged.constant(want[:200])).numpy()]
    assert texts == reference.batch_decode(want[:200], skip_special_tokens=True)


def test_bad_sentencepiece_files_are_refused(tmp_path, charsmap, t5_folder):
    (tmp_path / "spiece.model").write_bytes(b"\x0a\xff\xff garbage")
    with pytest.raises(ValueError, match="T5's settings only"):  # XLNet's, Pegasus's: not T5's
        folder_tokenizer_json(tmp_path)
    (tmp_path / "config.json").write_text('{"model_type": "t5"}')
    with pytest.raises(ValueError, match="not a SentencePiece model"):
        folder_tokenizer_json(tmp_path)
    (tmp_path / "spiece.model").write_bytes((t5_folder / "spiece.model").read_bytes())
    (tmp_path / "tokenizer_config.json").write_text('{"additional_special_tokens": 5}')
    with pytest.raises(ValueError, match="must be a list"):
        folder_tokenizer_json(tmp_path)
    bpe = tmp_path / "bpe.model"
    bpe.write_bytes(_train(mixed_lines(500, seed=1)[:500], model_type="bpe"))
    with pytest.raises(ValueError, match="Unigram"):
        sentencepiece_tokenizer_json(read_sentencepiece_model(bpe))
    proto = read_sentencepiece_model(bpe)
    proto.trainer_spec.model_type = 1
    with pytest.raises(ValueError, match="extra_ids"):
        sentencepiece_tokenizer_json(proto, extra_ids=10**9)
    with pytest.raises(ValueError, match="8 to"):
        read_charsmap(b"\x01")
    with pytest.raises(ValueError, match="trie size"):
        read_charsmap(b"\xff\xff\xff\x00" + charsmap[4:])
    (tmp_path / "empty").mkdir()
    assert folder_tokenizer_json(tmp_path / "empty") is None
    bad_base64 = {"type": "Precompiled", "precompiled_charsmap": "%%%"}
    with pytest.raises(ValueError, match="base64"):
        from_tokenizer_json({**sentencepiece_tokenizer_json(proto), "normalizer": bad_base64})


def test_a_malformed_trie_changes_nothing_outside_it(charsmap):
    """Every unit flipped: the walk stays inside the arrays and the call returns."""
    rng = random.Random(0)
    units = bytearray(charsmap)
    for i in range(4, 4 + len(charsmap) // 2, 4):
        units[i : i + 4] = rng.getrandbits(32).to_bytes(4, "little")
    normalize = precompiled_normalizer(bytes(units))
    texts = ["héllo ＡＢＣ ½ ﬁ", "\u0301", "", "\uff21\u0301b"]
    out = normalize(tf.constant(texts)).numpy()
    assert out.shape == (4,)
    for text in out:  # whatever the trie says, the text stays UTF-8
        text.decode("utf-8")
    # Replacement strings that are not UTF-8 are refused when the charsmap is read.
    with pytest.raises(ValueError, match="not UTF-8"):
        read_charsmap(charsmap + b"\xff\x00")
