"""Keras-native quantization (`model.quantize("int8")`, `"float8"`) on every model and head:
close to the float model, atomic, reloaded quantized, exported with parity to the quantized
Keras model."""

import warnings

import keras
import numpy as np
import pytest

from tests.helpers import run_in_fresh_process
from tests.models.model_cases import MODELS, build


@pytest.fixture(autouse=True)
def no_collection_per_variable(monkeypatch):
    """Keras's `Layer.__delattr__` runs a full `gc.collect()` for each variable it deletes,
    which quantizing (and loading a quantized model) does once per kernel: 26 collections of
    this test process's heap for a seq2seq model, 6 s of its 20 (101 collections, 27 s of
    the 50 of four of these tests). No value depends on when garbage is collected; Python's
    automatic collection still runs."""
    import gc

    monkeypatch.setattr(gc, "collect", lambda generation=2: 0)


def outputs(model, inputs):
    return [keras.ops.convert_to_numpy(o) for o in keras.tree.flatten(model(inputs))]


def quantized(model):
    return sorted(la.path for la in model._flatten_layers() if la.quantization_mode)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_int8_quantizes_every_model_close_to_float_and_reloads_quantized(name, tmp_path):
    model, inputs, _ = build(name)
    before = outputs(model, inputs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Keras: "Layer Add does not have a quantize method"
        model.quantize("int8")
    after = outputs(model, inputs)
    assert len(quantized(model)) >= 4  # the attention projections at least
    scale = max(np.abs(b).max() for b in before)
    drift = max(np.abs(a - b).max() for a, b in zip(after, before, strict=True))
    assert 0 < drift <= 0.05 * scale + 1e-3, (drift, scale)  # changed, and only a little
    model.save(tmp_path / "q.keras")
    again = keras.saving.load_model(tmp_path / "q.keras")
    assert quantized(again) == quantized(model)
    for a, b in zip(outputs(again, inputs), after, strict=True):
        np.testing.assert_array_equal(a, b)


def test_float8_quantizes_and_reloads(tmp_path):
    model, inputs, _ = build("classifier_cls")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.quantize("float8")
    modes = {la.quantization_mode for la in model._flatten_layers()} - {None}
    assert modes == {"float8"}
    model.save(tmp_path / "f8.keras")
    again = keras.saving.load_model(tmp_path / "f8.keras")
    for a, b in zip(outputs(again, inputs), outputs(model, inputs), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda m: m.quantize("int3"), "mode=int3"),
        (lambda m: setattr(m, "extra", keras.layers.Dense(3)) or m.quantize("int8"), "built"),
        (lambda m: m.quantize("int8", filters="no_such_layer"), "No layer"),
    ],
)
def test_a_refused_quantization_changes_nothing(change, match):
    model, inputs, _ = build("causal_lm")
    before = outputs(model, inputs)
    with pytest.raises(ValueError, match=match):
        change(model)
    assert quantized(model) == []
    for a, b in zip(outputs(model, inputs), before, strict=True):
        np.testing.assert_array_equal(a, b)


def test_quantized_keras_file_reloads_in_a_fresh_process(tmp_path):
    model = build("causal_lm_llama")[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.quantize("int8")
    model.save(tmp_path / "q.keras")
    expected = model.generate([[5, 6, 7]], max_new_tokens=6)
    script = (
        "import sys, json, keras\n"
        "import keras_attn\n"
        "lm = keras.saving.load_model(sys.argv[1])\n"
        "modes = sorted({la.quantization_mode or '' for la in lm._flatten_layers()})\n"
        "print('RESULT', json.dumps([lm.generate([[5, 6, 7]], max_new_tokens=6), modes]))\n"
    )
    generated, modes = run_in_fresh_process(script, tmp_path / "q.keras")
    assert generated == expected and modes == ["", "int8"]


@pytest.mark.tf_only
@pytest.mark.slow
@pytest.mark.parametrize("name", ["causal_lm_llama", "classifier_cls", "seq2seq_separate"])
def test_int8_keras_model_exports_with_parity_to_itself(name, tmp_path):
    from keras_attn_export import export_model
    from keras_attn_export.api import KERAS_QUANTIZED_TOLERANCE

    model = build(name)[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.quantize("int8")
    manifest = export_model(model, tmp_path / "q", formats=["onnx"], verbose=False)
    worst = max(row["onnx_vs_keras"] for row in manifest["parity"]["rows"])
    assert worst <= KERAS_QUANTIZED_TOLERANCE and manifest["parity"]["tolerance"] == 5e-2
    # The int8 math is what was exported: each quantized Dense is a MatMulInteger over an
    # int8 kernel (tf2onnx folds EinsumDense's int8 kernels into float constants; the parity
    # above holds for them all the same).
    import onnx

    graph = onnx.load(tmp_path / "q" / "model.onnx").graph
    dense = [la for la in model._flatten_layers()
             if isinstance(la, keras.layers.Dense) and la.quantization_mode]  # fmt: skip
    assert sum(node.op_type == "MatMulInteger" for node in graph.node) >= len(dense) >= 1
    if name == "causal_lm_llama":
        from keras_attn_serving import Predictor

        assert manifest["decoding"]["gqa"]["file"] is None  # decode.onnx runs the int8 math
        assert Predictor(tmp_path / "q").generate_ids([[5, 6, 7]], 6) == model.generate(
            [[5, 6, 7]], max_new_tokens=6
        )


def test_each_model_records_its_own_quantized_layers(tmp_path):
    """A backbone keeps its record wherever it is saved: alone, in a task, inside a plain
    Keras model quantized by Keras itself; quantizing again only adds layers."""
    model, inputs, _ = build("causal_lm")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.quantize("int8", filters="value")
        model.quantize("int8")  # the rest; the value projections are skipped, not refused
    model.backbone.save(tmp_path / "backbone.keras")
    backbone = keras.saving.load_model(tmp_path / "backbone.keras")
    assert quantized(backbone) == quantized(model.backbone)
    ids = inputs[:, :4]
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(backbone(ids)), keras.ops.convert_to_numpy(model.backbone(ids))
    )
    plain_in = keras.Input((None,), dtype="int32")
    hidden = build("causal_lm")[0].backbone(plain_in)
    plain = keras.Model(plain_in, keras.layers.Dense(2, name="head")(hidden))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain.quantize("int8")  # Keras's own quantize: our backbone's config still records
    plain.save(tmp_path / "plain.keras")
    again = keras.saving.load_model(tmp_path / "plain.keras")
    for a, b in zip(outputs(again, ids), outputs(plain, ids), strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_custom_int8_config_is_saved_and_calibrated_modes_are_refused(tmp_path):
    model, inputs, _ = build("classifier_cls")
    weight_only = keras.quantizers.Int8QuantizationConfig(activation_quantizer=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.quantize(config=weight_only)
    model.save(tmp_path / "w.keras")
    again = keras.saving.load_model(tmp_path / "w.keras")
    for a, b in zip(outputs(again, inputs), outputs(model, inputs), strict=True):
        np.testing.assert_array_equal(a, b)
    fresh, _, _ = build("classifier_cls")
    with pytest.raises(ValueError, match="calibration"):
        fresh.quantize("gptq", config=keras.quantizers.GPTQConfig(dataset=[], tokenizer=None))
    assert quantized(fresh) == []
