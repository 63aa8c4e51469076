"""Every metric against cases computed by hand."""

import math

import numpy as np
import pytest

from keras_attn.metrics import (
    MaskedAccuracy,
    bleu,
    entity_f1,
    exact_match,
    normalize_answer,
    rouge,
    token_f1,
)


def test_masked_accuracy_skips_the_ignored_targets():
    logits = np.zeros((1, 4, 5), "float32")
    logits[0, [0, 1, 2, 3], [3, 2, 4, 1]] = 1.0  # predictions 3, 2, 4, 1
    metric = MaskedAccuracy()
    metric.update_state(np.array([[3, 1, 4, 0]]), logits)  # 2 of 3 real targets right
    assert float(metric.result()) == pytest.approx(2 / 3)
    metric.update_state(np.array([[0, 2, 0, 0]]), logits)  # one more, right
    assert float(metric.result()) == pytest.approx(3 / 4)
    assert (
        MaskedAccuracy.from_config(MaskedAccuracy(ignore_class=-1).get_config()).ignore_class == -1
    )


TRUE = [["B-PER", "I-PER", "O", "B-LOC"], ["O", "B-ORG", "I-ORG", "O"]]
PRED = [["B-PER", "I-PER", "O", "O"], ["O", "B-ORG", "O", "B-LOC"]]


def test_entity_f1_by_hand():
    # True entities: PER(0-1), LOC(3), ORG(1-2). Predicted: PER(0-1), ORG(1), LOC(3 of row 2).
    # Correct: PER only. Precision 1/3, recall 1/3, F1 1/3.
    assert entity_f1(TRUE, PRED) == pytest.approx(1 / 3)
    assert entity_f1(TRUE, TRUE) == 1.0


def test_token_f1_by_hand():
    # Entity-tag tokens: true 5, predicted 4; equal and non-O at 3 positions (B-PER, I-PER,
    # B-ORG). Precision 3/4, recall 3/5, F1 = 2·0.75·0.6 / 1.35 = 2/3.
    assert token_f1(TRUE, PRED) == pytest.approx(2 / 3)
    assert token_f1([["O", "O"]], [["O", "O"]]) == 0.0
    with pytest.raises(ValueError, match="true_tags"):
        token_f1(TRUE, PRED[:1])


def test_exact_match_normalizes_like_squad():
    assert normalize_answer("The  Eiffel Tower!") == "eiffel tower"
    assert exact_match(["the Eiffel tower", "Paris", "1889"], ["Eiffel Tower", "London", "1889."]) \
        == pytest.approx(2 / 3)  # fmt: skip
    assert exact_match([[1, 2], [3]], [[1, 2], [3, 4]]) == 0.5
    with pytest.raises(ValueError, match="predictions"):
        exact_match([], [])


def test_bleu_by_hand():
    assert bleu(["the cat sat on the mat"], ["the cat sat on the mat"]) == pytest.approx(100.0)
    # Hypothesis "the cat sat on the" against "the cat sat on the mat": n-gram precisions
    # 5/5, 4/4, 3/3, 2/2; brevity penalty exp(1 - 6/5).
    assert bleu(["the cat sat on the"], ["the cat sat on the mat"]) == pytest.approx(
        100 * math.exp(1 - 6 / 5), rel=1e-4
    )
    # "a b c d x" vs "a b c d e": precisions 4/5, 3/4, 2/3, 1/2; same length.
    expected = 100 * (4 / 5 * 3 / 4 * 2 / 3 * 1 / 2) ** 0.25
    assert bleu(["a b c d x"], ["a b c d e"]) == pytest.approx(expected, rel=1e-4)


def test_rouge_by_hand():
    scores = rouge(["the cat was found under the bed"], ["the cat was under the bed"])
    # unigrams: 6 of the 7 hypothesis tokens match; P = 6/7, R = 6/6.
    assert scores["rouge1"] == pytest.approx(2 * (6 / 7) / (6 / 7 + 1))
    # bigrams: hypothesis 6, reference 5; common: the-cat, cat-was, under-the, the-bed = 4.
    assert scores["rouge2"] == pytest.approx(2 * (4 / 6) * (4 / 5) / (4 / 6 + 4 / 5))
    # LCS = "the cat was under the bed" = 6 tokens: same as ROUGE-1 here.
    assert scores["rougeL"] == pytest.approx(scores["rouge1"])
    two = rouge(["a b", "c d"], ["a b", "x y"])
    assert two["rouge1"] == pytest.approx(0.5)
    np.testing.assert_allclose(list(two.values()), [0.5, 0.5, 0.5])
