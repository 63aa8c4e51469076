import keras
import numpy as np
import pytest

from keras_attn.optimizers import InverseSqrtSchedule, WarmupDecay, adamw


def values(schedule, steps):
    return [float(schedule(s)) for s in steps]


def test_inverse_sqrt_schedule_pinned():
    schedule = InverseSqrtSchedule(512, warmup_steps=4000)
    # Step s = iterations + 1; peak at s = 4000: 512^-0.5 · 4000^-0.5.
    np.testing.assert_allclose(
        values(schedule, [0, 1999, 3999, 15999]),
        [512**-0.5 * 4000**-1.5, 512**-0.5 * 2000 * 4000**-1.5, (512 * 4000) ** -0.5,
         512**-0.5 * 16000**-0.5],
        rtol=1e-5,
    )  # fmt: skip
    assert InverseSqrtSchedule.from_config(schedule.get_config()).warmup_steps == 4000


def test_warmup_decay_pinned():
    linear = WarmupDecay(1e-3, warmup_steps=10, total_steps=110)
    np.testing.assert_allclose(values(linear, [0, 5, 10, 60, 110, 500]),
                               [0, 5e-4, 1e-3, 5e-4, 0, 0], atol=1e-9)  # fmt: skip
    cosine = WarmupDecay(1e-3, 10, 110, decay="cosine", final_learning_rate=1e-4)
    np.testing.assert_allclose(values(cosine, [10, 35, 60, 110]),
                               [1e-3, 1e-4 + 9e-4 * (1 + np.cos(np.pi / 4)) / 2, 5.5e-4, 1e-4],
                               rtol=1e-5)  # fmt: skip
    with pytest.raises(ValueError, match="total_steps"):
        WarmupDecay(1e-3, 10, 10)
    with pytest.raises(ValueError, match="decay"):
        WarmupDecay(1e-3, 1, 10, decay="step")
    with pytest.raises(ValueError, match="warmup_steps"):
        InverseSqrtSchedule(64, warmup_steps=0)


def test_adamw_decays_kernels_not_biases_or_layer_norm_and_clips():
    layer = keras.layers.Dense(2, bias_initializer="ones")
    norm = keras.layers.LayerNormalization()
    layer.build((None, 3))
    norm.build((None, 2))
    variables = [layer.kernel, layer.bias, norm.gamma, norm.beta]
    before = [keras.ops.convert_to_numpy(v).copy() for v in variables]
    optimizer = adamw(learning_rate=0.1, weight_decay=0.5, global_clipnorm=1.0)
    assert optimizer.global_clipnorm == 1.0
    # Zero gradients: Adam moves nothing, so only the decoupled decay w ← w − lr·wd·w acts.
    optimizer.apply_gradients([(keras.ops.zeros(v.shape), v) for v in variables])
    after = [keras.ops.convert_to_numpy(v) for v in variables]
    np.testing.assert_allclose(after[0], before[0] * (1 - 0.1 * 0.5), rtol=1e-6)
    for b, a in zip(before[1:], after[1:], strict=True):
        np.testing.assert_array_equal(a, b)
