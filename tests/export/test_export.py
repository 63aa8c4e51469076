import json

import numpy as np
import pytest
import tensorflow as tf
from keras_attn_export import ParityError, export_model
from keras_attn_export.onnx import run_onnx
from keras_attn_serving import Predictor
from keras_attn_serving.manifest import read_manifest, sha256

from tests.conftest import keras_greedy

pytestmark = pytest.mark.tf_only


def test_artifact_folder_layout_and_manifest(toy_artifact):
    folder, manifest = toy_artifact
    assert (folder / "model.onnx").is_file() and (folder / "saved_model/saved_model.pb").is_file()
    assert (folder / "saved_model/assets/vocab.txt").is_file()
    on_disk = json.loads((folder / "manifest.json").read_text())
    assert on_disk == manifest.model_dump(mode="json")
    assert read_manifest(folder) == manifest
    assert [spec.model_dump() for spec in manifest.inputs] == [
        {"name": "token_ids", "dtype": "int32", "shape": ["batch", "sequence"]}
    ]
    assert manifest["outputs"][0]["name"] == "logits"
    assert manifest["onnx"]["opset"] == 17 and manifest["max_sequence_length"] == 24
    for rel, digest in manifest["files"].items():
        assert sha256(folder / rel) == digest
    assert {"tensorflow", "keras", "tf2onnx", "onnxruntime"} <= set(manifest["versions"])


def test_parity_at_two_batch_sizes_and_two_lengths(toy_artifact):
    _, manifest = toy_artifact
    rows = manifest["parity"]["rows"]
    assert {(r["batch"], r["seq"]) for r in rows} == {(1, 7), (1, 16), (3, 7), (3, 16)}
    for row in rows:
        assert row["saved_model_vs_keras"] <= 1e-4 and row["onnx_vs_keras"] <= 1e-4


def test_onnx_and_saved_model_match_keras_on_fresh_padded_inputs(toy_artifact, toy_lm):
    import onnxruntime as ort

    folder, _ = toy_artifact
    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    signature = tf.saved_model.load(str(folder / "saved_model")).signatures["serving_default"]
    ids = np.array([[5, 9, 12, 7, 0, 0], [8, 8, 3, 0, 0, 0]], "int32")
    expected = toy_lm.predict(ids, verbose=0)
    np.testing.assert_allclose(run_onnx(session, {"token_ids": ids})["logits"], expected, atol=1e-4)
    saved = signature(token_ids=tf.constant(ids))["logits"].numpy()
    np.testing.assert_allclose(saved, expected, atol=1e-4)
    with pytest.raises(ValueError, match="token_ids"):
        run_onnx(session, {"ids": ids})


def test_predictor_generates_the_keras_greedy_tokens(toy_artifact, toy_lm, toy_tokenizer):
    folder, _ = toy_artifact
    predictor = Predictor(folder)
    prompts = [
        toy_tokenizer.tokenize("to be or").numpy().tolist(),
        toy_tokenizer.tokenize("the slings and").numpy().tolist(),
    ]
    got = predictor.generate_ids(prompts, max_new_tokens=8)  # one batch, prompts of two lengths
    assert got == [keras_greedy(toy_lm, p, 8) for p in prompts]
    text = predictor.generate("to be or", max_new_tokens=3)
    assert text.startswith("to be or") and len(text) > len("to be or")


def test_failed_parity_raises_with_the_table_and_leaves_nothing(toy_lm, tmp_path):
    with pytest.raises(ParityError, match="onnx_vs_keras"):
        export_model(toy_lm, tmp_path / "out", tolerance=0.0, verbose=False)
    assert list(tmp_path.iterdir()) == []


def test_bad_export_arguments(toy_lm, tmp_path):
    with pytest.raises(ValueError, match="opset"):
        export_model(toy_lm, tmp_path / "a", opset=19)
    with pytest.raises(ValueError, match="model"):
        export_model(object(), tmp_path / "b")
    from keras_attn.tokenizers import ByteTokenizer

    with pytest.raises(ValueError, match="tokenizer"):
        export_model(toy_lm, tmp_path / "d", tokenizer=ByteTokenizer())
    (tmp_path / "c").mkdir()
    with pytest.raises(ValueError, match="out_dir"):
        export_model(toy_lm, tmp_path / "c", overwrite=False)


@pytest.mark.parametrize("opset", [13, 18])
def test_opset_range_converts_and_matches(toy_lm, tmp_path, opset):
    manifest = export_model(toy_lm, tmp_path / "lm", opset=opset, verbose=False)
    assert manifest["onnx"]["opset"] == opset
    assert manifest["parity"]["max_abs_diff"] <= 1e-4
    gqa = manifest["decoding"]["gqa"]  # LayerNormalization needs 17: never written lower
    assert gqa["file"] == "decode_gqa.onnx" and gqa["opset"] == max(opset, 17)


def test_serve_text_signature_takes_strings_and_matches_the_ids_signature(toy_artifact, toy_lm):
    import tensorflow_text  # noqa: F401  the strings graph uses tensorflow-text ops

    folder, manifest = toy_artifact
    assert manifest["saved_model"]["signatures"] == ["serving_default", "serve_text"]
    assert manifest["parity"]["serve_text_vs_serving_default"] == 0.0
    loaded = tf.saved_model.load(str(folder / "saved_model"))
    text = tf.constant(["to be or not", "the slings and arrows"])
    from_text = loaded.signatures["serve_text"](text=text)["logits"].numpy()
    predictor = Predictor(folder)  # tokenizes with the `tokenizers` library, no TensorFlow
    ids = predictor.tokenizer.encode([t.decode() for t in text.numpy()])
    width = max(map(len, ids))
    padded = np.array([row + [0] * (width - len(row)) for row in ids], "int32")
    from_ids = loaded.signatures["serving_default"](token_ids=tf.constant(padded))["logits"]
    np.testing.assert_array_equal(from_text, from_ids.numpy())
    np.testing.assert_allclose(from_text, toy_lm.predict(padded, verbose=0), atol=1e-4)
    # Text longer than the position table is cut to it rather than failing.
    long = loaded.signatures["serve_text"](text=tf.constant(["to be or not " * 20]))["logits"]
    assert long.shape[1] == manifest["max_sequence_length"]


def test_serve_text_with_a_packer(toy_lm, toy_tokenizer, tmp_path):
    import tensorflow_text  # noqa: F401

    from keras_attn.preprocessing import StartEndPacker

    packer = StartEndPacker(12, start_value=toy_tokenizer.token_to_id("[BOS]"))
    manifest = export_model(toy_lm, tmp_path / "lm", tokenizer=toy_tokenizer, packer=packer,
                            verbose=False)  # fmt: skip
    assert manifest["parity"]["serve_text_vs_serving_default"] == 0.0
    loaded = tf.saved_model.load(str(tmp_path / "lm" / "saved_model"))
    out = loaded.signatures["serve_text"](text=tf.constant(["to be"]))["logits"]
    assert out.shape == (1, 12, toy_tokenizer.vocabulary_size())
