"""Checks every public layer gets: config, serialization, fresh-process reload, dtypes, fit."""

import inspect
import json

import keras
import numpy as np
import pytest

from tests.helpers import CASE_IDS, CASES, public_layer_classes, run_in_fresh_process, to_numpy


def test_every_public_layer_has_a_case():
    covered = {c.cls for c in CASES}
    missing = [cls.__name__ for cls in public_layer_classes() if cls not in covered]
    assert not missing, f"add a Case in tests/helpers.py for: {missing}"


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_every_init_argument_is_in_get_config(case):
    base = set(inspect.signature(keras.layers.Layer.__init__).parameters)
    params = [
        p
        for p in inspect.signature(case.cls.__init__).parameters.values()
        if p.name not in base and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
    ]
    assert {p.name for p in params} <= set(case.init_kwargs), "the case must set every argument"
    config = case.make().get_config()
    for p in params:
        assert p.name in config, f"{case.name}.get_config() lacks `{p.name}`"
        value = config[p.name]
        if isinstance(value, dict) and "class_name" in value:  # a serialized initializer
            value = value.get("class_name", value)
            expected = case.init_kwargs[p.name]
            expected = keras.initializers.get(expected).__class__.__name__
        else:
            expected = case.init_kwargs[p.name]
        assert value == expected, f"{p.name}: {value!r} != {expected!r}"


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_config_json_round_trip(case):
    layer = case.make(name="probe")
    config = json.loads(json.dumps(keras.saving.serialize_keras_object(layer)))
    clone = keras.saving.deserialize_keras_object(config)
    assert type(clone) is case.cls
    assert clone.get_config() == layer.get_config()


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_symbolic_and_eager_calls_agree(case):
    model = case.model()
    layer = model.layers[-1]
    symbolic = model.predict(case.inputs, verbose=0)
    eager = layer(*case.inputs, **case.call_kwargs)
    np.testing.assert_allclose(symbolic, to_numpy(eager), rtol=1e-5, atol=1e-5)
    assert np.isfinite(symbolic).all()


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_one_fit_step_updates_weights(case):
    keras.utils.set_random_seed(1)
    model = case.model()
    target = np.ones_like(model.predict(case.inputs, verbose=0))
    if not model.trainable_weights:
        pytest.skip(f"{case.name} has no weights; its fit step is covered by the blocks using it")
    if target.shape[0] != len(case.inputs[0]):
        pytest.skip(f"{case.name} is one tensor for the batch; its fit step is the T5 case's")
    before = [to_numpy(w).copy() for w in model.trainable_weights]
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    history = model.fit(case.inputs, target, batch_size=2, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    changed = [
        not np.allclose(b, to_numpy(w))
        for b, w in zip(before, model.trainable_weights, strict=True)
    ]
    assert any(changed)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_mixed_precision_matches_float32(case, policy):
    ref = case.make()
    ref_out = to_numpy(ref(*case.inputs, **case.call_kwargs))
    mixed = case.make(dtype=policy)
    mixed(*case.inputs, **case.call_kwargs)
    mixed.set_weights(ref.get_weights())
    out = mixed(*case.inputs, **case.call_kwargs)
    assert keras.backend.standardize_dtype(out.dtype) == policy.split("_")[1]
    assert all(keras.backend.standardize_dtype(w.dtype) == "float32" for w in mixed.weights)
    out = to_numpy(keras.ops.cast(out, "float32"))
    assert np.isfinite(out).all()
    tol = 0.05 if policy == "mixed_bfloat16" else 0.01
    np.testing.assert_allclose(out, ref_out, rtol=tol, atol=tol * max(1.0, np.abs(ref_out).max()))


_LOAD_AND_RUN = """
import json, sys
import numpy as np
import keras
import keras_attn  # noqa: F401  registers our classes; no custom_objects are passed
results = {}
for name in json.loads(sys.argv[1]):
    data = np.load(f"{sys.argv[2]}/{name}.npz")
    inputs = [data[f"in{i}"] for i in range(len(data.files) - 1)]
    model = keras.saving.load_model(f"{sys.argv[2]}/{name}.keras")
    out = model.predict(inputs, verbose=0)
    results[name] = float(np.abs(out - data["out"]).max())
print("RESULT " + json.dumps(results))
"""


def test_keras_save_and_load_in_a_fresh_process(tmp_path):
    keras.utils.set_random_seed(2)
    for case in CASES:
        model = case.model()
        out = model.predict(case.inputs, verbose=0)
        model.save(tmp_path / f"{case.name}.keras")
        np.savez(
            tmp_path / f"{case.name}.npz",
            out=out,
            **{f"in{i}": x for i, x in enumerate(case.inputs)},
        )
    diffs = run_in_fresh_process(_LOAD_AND_RUN, json.dumps(CASE_IDS), tmp_path)
    assert set(diffs) == set(CASE_IDS)
    assert max(diffs.values()) <= 1e-6, diffs


_WITHOUT_TENSORFLOW = """
import json, sys


class NoTensorFlow:  # as on a machine with JAX or PyTorch only
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("tensorflow", "tensorflow_text", "tf_keras"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


sys.meta_path.insert(0, NoTensorFlow())
import numpy as np
import keras
import keras_attn

keras.utils.set_random_seed(0)
model = keras_attn.models.CausalLM(50, 8, hidden_dim=16, num_layers=1, num_heads=2)
ids = np.arange(1, 9, dtype="int32")[None]
out = keras.ops.convert_to_numpy(model(ids))
model.save(sys.argv[1] + "/lm.keras")
loaded = keras.saving.load_model(sys.argv[1] + "/lm.keras")
diff = float(np.abs(keras.ops.convert_to_numpy(loaded(ids)) - out).max())
print("RESULT " + json.dumps({"diff": diff, "backend": keras.backend.backend(),
                              "tensorflow": "tensorflow" in sys.modules}))
"""


def test_import_keras_attn_registers_models_and_needs_no_tensorflow_on_jax(tmp_path):
    # `import keras_attn` alone lets `load_model` find our models (no custom_objects), and
    # on a JAX-only machine (the GPU machines) it imports without TensorFlow.
    result = run_in_fresh_process(_WITHOUT_TENSORFLOW, tmp_path, backend="jax")
    assert result == {"diff": 0.0, "backend": "jax", "tensorflow": False}
