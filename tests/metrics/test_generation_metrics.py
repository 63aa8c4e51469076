"""Word error rate, METEOR and BERTScore: pinned by hand, and equal to their reference
implementations (`jiwer`, NLTK's METEOR, the `bert-score` package on the packaged MiniLM)."""

import numpy as np
import pytest

from keras_attn.metrics import bert_score, meteor, word_error_rate


def test_word_error_rate_by_hand_corpus_and_sentence():
    hypotheses = ["a b", "x"]
    references = ["a b c d", "y"]
    # Pair 1: 2 deletions of 4 words; pair 2: 1 substitution of 1.
    rates = word_error_rate(hypotheses, references)
    assert rates["corpus"] == pytest.approx(3 / 5)
    assert rates["sentence"] == pytest.approx((2 / 4 + 1) / 2)
    assert word_error_rate(["the cat sat"], ["the cat sat"])["corpus"] == 0.0
    # An insertion counts too: the rate can pass 1.
    assert word_error_rate(["a b c"], ["a"])["corpus"] == pytest.approx(2.0)
    with pytest.raises(ValueError, match="reference must have a word"):
        word_error_rate(["a"], ["  "])
    with pytest.raises(ValueError, match="same length"):
        word_error_rate(["a"], ["a", "b"])


def test_meteor_exact_and_stem_matching_by_hand():
    # Exact: "the cat sat on"; stem: "mats" ~ "mat" (Porter), after the reference's "a".
    scores = meteor(["The cat sat on mats"], ["the cat sat on a mat"])
    matched, hyp, ref = 5, 5, 6
    precision, recall = matched / hyp, matched / ref
    fmean = precision * recall / (0.9 * precision + 0.1 * recall)
    chunks = 2  # "the cat sat on", then "mats"~"mat"
    expected = fmean * (1 - 0.5 * (chunks / matched) ** 3)
    assert scores["sentence"] == pytest.approx(expected)
    assert scores["corpus"] == pytest.approx(expected)  # one pair: the same
    assert meteor(["nothing alike"], ["completely different"])["corpus"] == 0.0


def test_meteor_equals_nltk_per_sentence_and_pools_the_corpus():
    from nltk.stem.porter import PorterStemmer
    from nltk.translate.meteor_score import single_meteor_score

    class NoSynonyms:
        def synsets(self, *args, **kwargs):
            return []

    hypotheses = ["the quick brown fox jumped", "a dog barks loudly at night", "hello"]
    references = ["the fast brown fox jumps", "dogs bark at night", "hello world"]
    expected = [
        single_meteor_score(r.split(), h.split(), stemmer=PorterStemmer(), wordnet=NoSynonyms())
        for h, r in zip(hypotheses, references, strict=True)
    ]
    scores = meteor(hypotheses, references)
    assert scores["sentence"] == pytest.approx(np.mean(expected))
    assert scores["corpus"] != pytest.approx(scores["sentence"])  # pooled, not averaged
    assert 0 < scores["corpus"] < 1


@pytest.fixture(scope="module")
def minilm():
    from keras_attn.data import checkpoint_folder
    from keras_attn.models import Encoder
    from keras_attn.models.heads import folder_preprocessor

    folder = checkpoint_folder()
    return folder, Encoder.from_pretrained(folder, dropout=0.0), folder_preprocessor(folder, 64)


@pytest.mark.tf_only  # the preprocessor's tokenizer runs in TensorFlow
@pytest.mark.parametrize("idf, num_layers", [(False, None), (True, None), (False, 3),
                                             (True, 4), (False, 0)])  # fmt: skip
def test_bert_score_equals_the_bert_score_package(minilm, idf, num_layers):
    """`bert-score` itself on the packaged MiniLM (6 blocks): every block's output, and
    the first 0, 3 or 4 blocks' (`num_layers`, which `bert-score` chooses per checkpoint)."""
    reference_package = pytest.importorskip("bert_score")
    folder, encoder, preprocessor = minilm
    hypotheses = ["the cat sat on the mat", "hello there", "a completely different sentence"]
    references = ["a cat sat on a mat", "hi there friend", "the weather is nice today"]
    precision, recall, f1 = reference_package.score(
        hypotheses, references, model_type=str(folder), idf=idf, batch_size=2,
        num_layers=6 if num_layers is None else num_layers,
    )  # fmt: skip
    ours = bert_score(hypotheses, references, encoder, idf, 2, preprocessor, num_layers)
    np.testing.assert_allclose(ours["precision"]["sentence"], precision.numpy(), atol=1e-5)
    np.testing.assert_allclose(ours["recall"]["sentence"], recall.numpy(), atol=1e-5)
    np.testing.assert_allclose(ours["f1"]["sentence"], f1.numpy(), atol=1e-5)
    assert ours["f1"]["corpus"] == pytest.approx(float(f1.mean()), abs=1e-5)
    assert ours["f1"]["sentence"][0] > ours["f1"]["sentence"][2]  # similar beats unrelated
    if num_layers == 3:  # another layer, another score: the argument reaches the encoder
        every = bert_score(hypotheses, references, encoder, idf, 2, preprocessor)
        assert abs(every["f1"]["sentence"][1] - ours["f1"]["sentence"][1]) > 1e-3


@pytest.mark.tf_only
@pytest.mark.parametrize("num_layers", [-1, 7, 2.0, True])
def test_bert_score_refuses_a_layer_the_encoder_lacks(minilm, num_layers):
    _, encoder, preprocessor = minilm
    with pytest.raises(ValueError, match=r"`num_layers` must be an integer in \[0, 6\]"):
        bert_score(["a"], ["b"], encoder, preprocessor=preprocessor, num_layers=num_layers)
    from keras_attn.metrics import BERT_SCORE_LAYERS

    assert BERT_SCORE_LAYERS["roberta-large"] == 17  # bert-score's English default
