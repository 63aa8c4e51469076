"""Training setups: mixed bfloat16, MirroredStrategy on two CPU devices, resuming a fit."""

import keras
import numpy as np
import pytest

from keras_attn.models import CausalLM, SequenceClassifier
from tests.helpers import run_in_fresh_process
from tests.models.model_cases import ENCODER_INPUTS, TOKENS, encoder


def lm_data(n=32, length=12, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.integers(1, 40, size=(n, length)).astype("int32")
    x[:, 1::2] = (x[:, ::2] + 1) % 39 + 1  # every second token follows from the one before
    return x[:, :-1], x[:, 1:]


@pytest.mark.slow
def test_mixed_bfloat16_trains_with_float32_logits():
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        keras.utils.set_random_seed(0)
        lm = CausalLM(40, 16, hidden_dim=32, num_layers=1, num_heads=2)
        classifier = SequenceClassifier(encoder(), 2, dropout=0.0)
        assert lm.backbone.get_layer("decoder_block_0").compute_dtype == "bfloat16"
    finally:
        keras.config.set_dtype_policy("float32")
    x, y = lm_data()
    lm.compile(optimizer=keras.optimizers.Adam(3e-3))
    history = lm.fit(x, y, epochs=4, batch_size=8, verbose=0).history["loss"]
    assert history[-1] < history[0] - 0.2
    assert keras.backend.standardize_dtype(lm(x[:2]).dtype) == "float32"
    assert all(w.dtype == "float32" for w in lm.weights)  # variables stay float32
    classifier.compile(optimizer=keras.optimizers.Adam(1e-2))
    labels = np.array([0, 1])
    losses = classifier.fit(ENCODER_INPUTS, labels, epochs=8, verbose=0).history["loss"]
    assert losses[-1] < 0.75 * losses[0]
    out = classifier(ENCODER_INPUTS)
    assert keras.backend.standardize_dtype(out.dtype) == "float32"


_MIRRORED = """
import json
import numpy as np
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    cpu, [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()])
import keras
from keras_attn.models import CausalLM

rng = np.random.default_rng(0)
x = rng.integers(1, 40, size=(8, 10)).astype("int32")
y = rng.integers(1, 40, size=(8, 10)).astype("int32")

def one_step(strategy):
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = CausalLM(40, 16, hidden_dim=16, num_layers=1, num_heads=2)
        model.compile(optimizer=keras.optimizers.SGD(0.5))
    before = [w.copy() for w in model.get_weights()]
    loss = model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0).history["loss"][0]
    return model, before, loss

mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
m2, before2, loss2 = one_step(mirrored)
m1, before1, loss1 = one_step(tf.distribute.get_strategy())
diff_init = max(float(np.abs(a - b).max()) for a, b in zip(before1, before2))
diff = max(float(np.abs(a - b).max()) for a, b in zip(m1.get_weights(), m2.get_weights()))
moved = max(float(np.abs(a - b).max()) for a, b in zip(before1, m1.get_weights()))
print("RESULT " + json.dumps({"replicas": mirrored.num_replicas_in_sync, "diff_init": diff_init,
      "diff": diff, "moved": moved, "loss1": loss1, "loss2": loss2,
      "jit": [m1.jit_compile, m2.jit_compile]}))
"""


@pytest.mark.slow
@pytest.mark.tf_only
def test_mirrored_strategy_on_two_cpu_devices_matches_one_device():
    result = run_in_fresh_process(_MIRRORED, backend="tensorflow")
    assert result["replicas"] == 2
    assert result["diff_init"] == 0.0
    assert result["moved"] > 1e-3  # the step changed the weights...
    assert result["diff"] < 1e-5  # ...identically with the batch split over two replicas
    assert result["loss1"] == pytest.approx(result["loss2"], rel=1e-5)
    assert result["jit"] == [True, False]  # XLA by default, off under tf.distribute


class StopAt(keras.callbacks.Callback):
    def __init__(self, epoch):
        super().__init__()
        self.epoch = epoch

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.epoch:
            raise RuntimeError("interrupted")


def test_backup_and_restore_resumes_an_interrupted_fit(tmp_path):
    x, y = lm_data(16)

    def fresh():
        keras.utils.set_random_seed(0)
        model = CausalLM(40, 16, hidden_dim=16, num_layers=1, num_heads=2)
        model.compile(optimizer=keras.optimizers.Adam(1e-2), jit_compile=False)
        return model

    reference = fresh()
    reference.fit(x, y, epochs=4, batch_size=8, shuffle=False, verbose=0)

    backup = keras.callbacks.BackupAndRestore(str(tmp_path / "backup"))
    model = fresh()
    with pytest.raises(RuntimeError, match="interrupted"):
        model.fit(x, y, epochs=4, batch_size=8, shuffle=False, verbose=0,
                  callbacks=[backup, StopAt(2)])  # fmt: skip
    resumed = fresh()  # a new process would start here
    history = resumed.fit(x, y, epochs=4, batch_size=8, shuffle=False, verbose=0,
                          callbacks=[backup])  # fmt: skip
    assert len(history.history["loss"]) == 2  # epochs 3 and 4 only
    for a, b in zip(reference.get_weights(), resumed.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)
    assert TOKENS.shape == (2, 6)


def test_numpy_ids_past_the_tables_are_a_value_error_after_the_first_trace():
    """Issue 19: once `predict` had traced a graph with an unknown sequence axis, a longer
    sequence or an id outside the vocabulary surfaced as a TensorFlow `Slice` / `GatherV2`
    error; NumPy inputs are now checked first, in fit, evaluate and predict."""
    model = CausalLM(50, 16, hidden_dim=16, num_layers=1, num_heads=2)
    model.compile()
    for length in (10, 12):  # two lengths: Keras retraces with the sequence axis unknown
        assert model.predict(np.ones((2, length), "int32"), verbose=0).shape == (2, length, 50)
    with pytest.raises(ValueError, match=r"`x\['token_ids'\]` has sequence length 20; the "
                                         r"model's position table holds 16"):  # fmt: skip
        model.predict(np.ones((2, 20), "int32"), verbose=0)
    with pytest.raises(ValueError, match=r"ids outside \[0, 50\): min 1, max 70"):
        model.predict(np.array([[1, 70]], "int32"), verbose=0)
    with pytest.raises(ValueError, match=r"min -1"):
        model.fit(np.array([[1, -1]]), np.array([[1, 1]]), verbose=0)
    with pytest.raises(ValueError, match="ids outside"):
        model.evaluate({"token_ids": np.array([[50, 1]])}, np.array([[1, 1]]), verbose=0)


def test_compile_defaults_to_a_fine_tuning_rate_on_a_pretrained_backbone():
    """Issue 41 item 11: Adam at 1e-3 undid the packaged MiniLM (loss 1.28 -> 1.92 -> 1.00,
    0.64 training accuracy in the README's tour); keras-hub's tasks default to 5e-5."""
    from keras_attn.data import checkpoint_folder
    from keras_attn.models import EncoderBackbone

    tuned = SequenceClassifier.from_pretrained(checkpoint_folder(), num_classes=2,
                                               sequence_length=16)  # fmt: skip
    tuned.compile()
    assert float(keras.ops.convert_to_numpy(tuned.optimizer.learning_rate)) == pytest.approx(5e-5)
    scratch = SequenceClassifier(EncoderBackbone(vocabulary_size=50, max_sequence_length=8,
                                                 hidden_dim=8, num_layers=1, num_heads=2),
                                 num_classes=2)  # fmt: skip
    scratch.compile()
    assert float(keras.ops.convert_to_numpy(scratch.optimizer.learning_rate)) == pytest.approx(1e-3)
    scratch.compile(optimizer=keras.optimizers.SGD(0.1))  # a given optimizer is kept
    assert isinstance(scratch.optimizer, keras.optimizers.SGD)
