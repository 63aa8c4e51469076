import keras
import numpy as np
import pytest

from keras_attn.losses import SparseCrossEntropy

LOGITS = np.array([[[2.0, 1.0, 0.0], [0.5, 0.5, 3.0], [1.0, 2.0, 3.0]]], "float32")
LABELS = np.array([[0, 2, 1]])


def nll(logits, label):
    return -(logits[label] - np.log(np.exp(logits).sum()))


def test_pinned_mean_and_ignore_class():
    expected = np.mean([nll(LOGITS[0, i], LABELS[0, i]) for i in range(3)])
    assert float(SparseCrossEntropy()(LABELS, LOGITS)) == pytest.approx(expected, rel=1e-6)
    # Ignoring label 1 drops the third target and averages over the two others.
    expected = np.mean([nll(LOGITS[0, 0], 0), nll(LOGITS[0, 1], 2)])
    loss = SparseCrossEntropy(ignore_class=1)(LABELS, LOGITS)
    assert float(loss) == pytest.approx(expected, rel=1e-6)
    negative = SparseCrossEntropy(ignore_class=-100)(np.array([[0, 2, -100]]), LOGITS)
    assert float(negative) == pytest.approx(expected, rel=1e-6)
    all_ignored = SparseCrossEntropy(ignore_class=-100)(np.full((1, 3), -100), LOGITS)
    assert float(all_ignored) == 0.0


def test_label_smoothing_matches_keras_categorical_crossentropy():
    one_hot = np.eye(3)[LABELS]
    for epsilon in (0.1, 0.3):
        ours = SparseCrossEntropy(label_smoothing=epsilon)(LABELS, LOGITS)
        keras_loss = keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=epsilon)
        assert float(ours) == pytest.approx(float(keras_loss(one_hot, LOGITS)), rel=1e-5)
    # By hand for one target: (1 - ε)·nll + ε·mean(-log p).
    logp = LOGITS[0, 0] - np.log(np.exp(LOGITS[0, 0]).sum())
    expected = 0.9 * -logp[0] + 0.1 * -logp.mean()
    loss = SparseCrossEntropy(label_smoothing=0.1)(LABELS[:, :1], LOGITS[:, :1])
    assert float(loss) == pytest.approx(expected, rel=1e-6)


def test_sample_weight_and_probabilities():
    weights = np.array([[1.0, 0.0, 2.0]])
    expected = (nll(LOGITS[0, 0], 0) + 2 * nll(LOGITS[0, 2], 1)) / 3
    loss = SparseCrossEntropy()(LABELS, LOGITS, sample_weight=weights)
    assert float(loss) == pytest.approx(expected, rel=1e-6)
    probs = np.exp(LOGITS) / np.exp(LOGITS).sum(-1, keepdims=True)
    from_probs = SparseCrossEntropy(from_logits=False)(LABELS, probs)
    assert float(from_probs) == pytest.approx(float(SparseCrossEntropy()(LABELS, LOGITS)), 1e-5)


def test_config_and_errors():
    loss = SparseCrossEntropy(ignore_class=0, label_smoothing=0.2)
    clone = SparseCrossEntropy.from_config(loss.get_config())
    assert (clone.ignore_class, clone.label_smoothing) == (0, 0.2)
    with pytest.raises(ValueError, match="label_smoothing"):
        SparseCrossEntropy(label_smoothing=1.0)
    with pytest.raises(ValueError, match="ignore_class"):
        SparseCrossEntropy(ignore_class="pad")
