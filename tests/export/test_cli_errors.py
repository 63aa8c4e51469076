"""Issue 26: an op ONNX lacks is a one-line error naming it, from the CLI and from the API."""

import os
import subprocess
import sys

import keras
import numpy as np
import pytest

pytestmark = pytest.mark.tf_only

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# A user's layer that calls TensorFlow directly: tf2onnx has no mapping for Lgamma.
LGAMMA_MODULE = """
import keras
import tensorflow as tf


@keras.saving.register_keras_serializable(package="issue26")
class LogGamma(keras.layers.Layer):
    def call(self, x):
        return tf.math.lgamma(x)
"""


def erfinv_model() -> keras.Model:
    """`keras.ops.erfinv` lowers to TensorFlow's Erfinv, which tf2onnx cannot convert."""
    x = keras.Input((4,), name="x")
    y = keras.ops.erfinv(keras.ops.tanh(keras.layers.Dense(4, name="dense")(x)))
    return keras.Model(x, y, name="erfinv_model")


def test_export_model_names_an_op_tf2onnx_cannot_convert(tmp_path):
    from keras_attn_export import export_model

    with pytest.raises(ValueError, match=r"tf2onnx cannot convert the TensorFlow op\(s\) Erfinv"):
        export_model(erfinv_model(), tmp_path / "out", formats=["onnx"], verbose=False)
    assert not (tmp_path / "out").exists()
    assert os.listdir(tmp_path) == []  # no temporary sibling left either


def test_an_op_onnxruntime_cannot_load_is_a_value_error(tmp_path):
    import onnx
    from keras_attn_export.onnx import check_loads
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Lgamma", ["x"], ["y"])], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, tmp_path / "model.onnx")
    with pytest.raises(
        ValueError, match=r"cannot run op Lgamma in the exported model\.onnx"
    ) as raised:
        check_loads(tmp_path / "model.onnx")
    assert str(tmp_path) not in str(raised.value)


@pytest.mark.slow
def test_cli_names_unconvertible_ops_in_one_line(tmp_path):
    (tmp_path / "lgamma_layer.py").write_text(LGAMMA_MODULE)
    sys.path.insert(0, str(tmp_path))
    try:
        import lgamma_layer

        x = keras.Input((4,), name="x")
        h = keras.layers.Dense(4, name="dense")(x)
        y = lgamma_layer.LogGamma()(keras.ops.softplus(h)) + keras.ops.erfinv(keras.ops.tanh(h))
        model = keras.Model(x, y, name="lgamma_model")
        assert np.isfinite(keras.ops.convert_to_numpy(model(np.ones((2, 4), "float32")))).all()
        model.save(tmp_path / "lgamma.keras")
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("lgamma_layer", None)
    env = {**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "3"}
    command = [sys.executable, "-m", "keras_attn_export.cli", "lgamma.keras", "out"]
    done = subprocess.run(
        [*command, "--formats", "onnx", "--import", "lgamma_layer"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    ours = [line for line in done.stderr.splitlines() if line.startswith("keras-attn-export: ")]
    assert len(ours) == 1, done.stderr[-2000:]
    assert "Erfinv, Lgamma" in ours[0] and "tf2onnx cannot convert" in ours[0]
    assert not (tmp_path / "out").exists()
    assert sorted(os.listdir(tmp_path)) == ["lgamma.keras", "lgamma_layer.py"]


def test_cli_exports_a_hugging_face_encoder_folder_as_an_embedding_model(tmp_path):
    """Issue 41 item 12: the packaged MiniLM could not be exported as an embedding model
    from the command line (no way to give a packer). Its folder now exports with its pooling
    and `[CLS] text [SEP]` packing, and the artifact embeds as Keras does."""
    from keras_attn_export.cli import main
    from keras_attn_serving import Predictor
    from keras_attn_serving.text import TextModel

    from keras_attn.data import checkpoint_folder
    from keras_attn.models import EncoderBackbone

    out = tmp_path / "minilm"
    argv = [str(checkpoint_folder()), str(out), "--task", "embed", "--formats", "onnx",
            "--sequence-length", "32"]  # fmt: skip
    assert main(argv) == 0
    predictor = Predictor(out)
    assert predictor.manifest.task == "embed"
    assert predictor.manifest.packer["start_value"] == 101  # [CLS]
    texts = ["A man is eating food.", "short"]
    model = TextModel(predictor)
    feeds, packed = model.encode(texts)
    served = model.embed(predictor.run(feeds), packed, "mean", True)
    keras_model = EncoderBackbone.from_pretrained(checkpoint_folder())
    tokens = np.asarray(feeds["token_ids"])
    sequence = keras.ops.convert_to_numpy(
        keras_model({"token_ids": tokens, "segment_ids": np.zeros_like(tokens)})["sequence_output"]
    )
    real = (tokens != 0)[..., None]
    expected = (sequence * real).sum(1) / real.sum(1)  # the folder's pooling: mean, normalized
    expected /= np.linalg.norm(expected, axis=-1, keepdims=True)
    np.testing.assert_allclose(np.asarray(served), expected, atol=1e-5)
