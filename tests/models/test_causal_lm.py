import keras
import numpy as np
import pytest

from keras_attn.data import lm_windows
from keras_attn.metrics import Perplexity
from keras_attn.models import build_causal_lm, lm_loss
from tests.helpers import to_numpy


def log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_lm_windows_pads_each_documents_tail():
    x, y = lm_windows([[1, 2, 3, 4, 5, 6], [7, 8, 9]], 4)
    np.testing.assert_array_equal(x, [[1, 2, 3, 4], [5, 6, 0, 0], [7, 8, 9, 0]])
    np.testing.assert_array_equal(y, [[2, 3, 4, 5], [6, 0, 0, 0], [8, 9, 0, 0]])
    with pytest.raises(ValueError, match="sequence_length"):
        lm_windows([[1, 2]], 0)


def test_loss_and_perplexity_ignore_padding():
    keras.utils.set_random_seed(0)
    model = build_causal_lm(30, 12, hidden_dim=16, num_layers=1, num_heads=2)
    model.compile(optimizer="sgd", loss=lm_loss(), metrics=[Perplexity()])
    x = np.array([[5, 6, 7, 8, 0, 0], [1, 2, 3, 4, 5, 6]], "int32")
    y = np.array([[6, 7, 8, 9, 0, 0], [2, 3, 4, 5, 6, 7]], "int32")
    result = model.evaluate(x, y, verbose=0, return_dict=True)
    logits = model.predict(x, verbose=0).astype("float64")
    ce = -np.take_along_axis(log_softmax(logits), y[..., None], -1)[..., 0]
    expected = ce[y != 0].mean()  # the 10 real targets only
    assert result["loss"] == pytest.approx(expected, rel=1e-5)
    assert result["perplexity"] == pytest.approx(np.exp(expected), rel=1e-5)
    assert not np.isclose(ce.mean(), expected)  # padding would have changed it


def test_perplexity_pinned():
    metric = Perplexity(from_logits=False)
    y_true = np.array([[1, 2, 0]])
    probs = np.array([[[0.1, 0.5, 0.4], [0.2, 0.2, 0.6], [0.9, 0.05, 0.05]]], "float32")
    metric.update_state(y_true, probs)
    assert float(metric.result()) == pytest.approx(np.exp(-(np.log(0.5) + np.log(0.6)) / 2), 1e-5)


def test_causal_lm_is_causal_and_output_is_tied():
    keras.utils.set_random_seed(1)
    model = build_causal_lm(40, 16, hidden_dim=16, num_layers=2, num_heads=2)
    a = np.array([[3, 4, 5, 6, 7, 8]], "int32")
    b = a.copy()
    b[0, 4:] = [20, 21]
    la, lb = model.predict(a, verbose=0), model.predict(b, verbose=0)
    np.testing.assert_allclose(la[:, :4], lb[:, :4], atol=1e-5)
    assert not np.allclose(la[:, 4:], lb[:, 4:])
    embeddings = [w for w in model.weights if w.path == "token_embedding/embeddings"]
    assert len(embeddings) == 1 and len(model.get_layer("token_embedding").weights) == 1
    assert la.dtype == np.float32 and la.shape == (1, 6, 40)


def test_padding_does_not_change_real_positions():
    model = build_causal_lm(40, 16, hidden_dim=16, num_layers=2, num_heads=2)
    short = model.predict(np.array([[3, 4, 5]], "int32"), verbose=0)
    padded = model.predict(np.array([[3, 4, 5, 0, 0]], "int32"), verbose=0)
    np.testing.assert_allclose(padded[:, :3], short, atol=1e-5)


def test_tied_weights_survive_keras_save_and_load(tmp_path):
    model = build_causal_lm(40, 16, hidden_dim=16, num_layers=1, num_heads=2)
    model.save(tmp_path / "lm.keras")
    loaded = keras.saving.load_model(tmp_path / "lm.keras")
    x = np.array([[3, 4, 5, 0]], "int32")
    np.testing.assert_allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0))
    assert len(loaded.weights) == len(model.weights)


def test_mixed_bfloat16_lm_trains_with_float32_logits():
    keras.mixed_precision.set_dtype_policy("mixed_bfloat16")
    try:
        model = build_causal_lm(40, 16, hidden_dim=16, num_layers=1, num_heads=2)
        model.compile(optimizer="adam", loss=lm_loss())
        x, y = lm_windows([np.arange(1, 30)], 8)
        history = model.fit(x, y, epochs=2, verbose=0)
        assert np.isfinite(history.history["loss"]).all()
        assert to_numpy(model(x)).dtype == np.float32
    finally:
        keras.mixed_precision.set_dtype_policy("float32")


def test_bad_position_encoding():
    with pytest.raises(ValueError, match="position_encoding"):
        build_causal_lm(10, 8, position_encoding="alibi")
