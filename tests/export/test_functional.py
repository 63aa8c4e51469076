"""A user's own functional model, first-class: tokenizer and packer inside the graph, a custom
layer from the user's module, `fit` → `.keras` → CLI export with `--task/--labels/--import` →
`/classify` over HTTP, equal to the Keras model's own probabilities."""

import json
import os
import subprocess
import sys

import httpx
import keras
import numpy as np
import pytest
import tensorflow as tf
from keras_attn_serving.server import ModelRepository, create_app
from keras_attn_serving.text import softmax

import keras_attn as ka
from tests.serving.test_server import serve_in_thread

pytestmark = pytest.mark.tf_only

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LINES = ["a fine play", "a dull play", "fine and good", "dull and bad", "good fine play"] * 8
TARGETS = np.array([1, 0, 1, 0, 1] * 8)
USER_MODULE = '''
import keras


@keras.saving.register_keras_serializable(package="user_layers")
class Scale(keras.layers.Layer):
    """The user's own layer: multiplies by a constant."""

    def __init__(self, factor=2.0, **kwargs):
        super().__init__(**kwargs)
        self.factor = factor

    def call(self, inputs):
        return inputs * self.factor

    def get_config(self):
        return {**super().get_config(), "factor": self.factor}
'''


def text_classifier(tokenizer, scale_layer=None):
    """strings → WordPieceTokenizer → StartEndPacker → our embedding and encoder → 2 logits."""
    from keras_attn.preprocessing import StartEndPacker

    packer = StartEndPacker(
        10, start_value=tokenizer.token_to_id("[CLS]"), end_value=tokenizer.token_to_id("[SEP]")
    )
    text = keras.Input((), dtype="string", name="text")
    ids = packer(tokenizer(text))
    x = ka.TokenAndPositionEmbedding(tokenizer.vocabulary_size(), 10, 16, mask_zero=True)(ids)
    x = ka.TransformerEncoder(num_heads=2, intermediate_dim=32)(x)
    x = keras.layers.GlobalAveragePooling1D()(x)
    if scale_layer is not None:
        x = scale_layer(x)
    return keras.Model(text, keras.layers.Dense(2, name="logits")(x))


@pytest.fixture(scope="module")
def trained(toy_tokenizer):
    from keras_attn.tokenizers import WordPieceTokenizer, train_wordpiece_vocabulary

    keras.utils.set_random_seed(0)
    tokenizer = WordPieceTokenizer(train_wordpiece_vocabulary(LINES, 60))
    model = text_classifier(tokenizer)
    model.compile(
        keras.optimizers.Adam(1e-2),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    history = model.fit(tf.constant(LINES), TARGETS, batch_size=8, epochs=4, verbose=0)
    return model, tokenizer, history


def test_tokenizer_inside_the_model_predicts_fits_and_evaluates(trained):
    model, tokenizer, history = trained
    losses = history.history["loss"]
    assert losses[-1] < losses[0]
    loss, accuracy = model.evaluate(tf.constant(LINES), TARGETS, verbose=0)
    assert accuracy == 1.0 and loss < losses[0]
    predicted = model.predict(tf.constant(LINES[:5]), verbose=0)
    np.testing.assert_array_equal(predicted.argmax(-1), TARGETS[:5])
    # predict on strings = the ids part on the same text, tokenized outside.
    from keras_attn_export.functional import split_text_model

    ids_model, found_tokenizer, packer = split_text_model(model)
    assert found_tokenizer is tokenizer
    ids = packer(tokenizer(tf.constant(LINES[:5])))
    np.testing.assert_allclose(ids_model(ids)["logits"], predicted, atol=1e-6)


def test_tokenizer_inside_the_model_saves_and_loads(trained, tmp_path):
    model, _, _ = trained
    model.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras")
    expected = model.predict(tf.constant(LINES[:5]), verbose=0)
    np.testing.assert_allclose(
        loaded.predict(tf.constant(LINES[:5]), verbose=0), expected, atol=1e-6
    )


def test_export_refuses_a_task_the_outputs_do_not_fit(trained, tmp_path):
    from keras_attn_export import export_model

    model, _, _ = trained
    with pytest.raises(ValueError, match=r"`task='tag'` needs one output of rank 3"):
        export_model(model, tmp_path / "x", task="tag", verbose=False)
    with pytest.raises(ValueError, match=r"`task` must be one of"):
        export_model(model, tmp_path / "x", task="summarize", verbose=False)
    with pytest.raises(ValueError, match=r"`labels` must be 2 strings"):
        export_model(model, tmp_path / "x", task="classify", labels=["a"], verbose=False)
    assert not (tmp_path / "x").exists()


@pytest.mark.slow
def test_new_user_path_fit_cli_export_and_classify_over_http(trained, tmp_path):
    _, tokenizer, _ = trained
    (tmp_path / "user_layers.py").write_text(USER_MODULE)
    sys.path.insert(0, str(tmp_path))
    try:
        import user_layers

        keras.utils.set_random_seed(1)
        model = text_classifier(tokenizer, user_layers.Scale(0.5))
        model.compile(
            keras.optimizers.Adam(1e-2),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        model.fit(tf.constant(LINES), TARGETS, batch_size=8, epochs=4, verbose=0)
        model.save(tmp_path / "sentiment.keras")
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("user_layers", None)
    env = {**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "3"}
    cli = [sys.executable, "-m", "keras_attn_export.cli", "sentiment.keras", "repo/sentiment/1"]
    options = ["--formats", "onnx", "--task", "classify", "--labels", "negative,positive"]
    # Without --import the custom layer cannot load: a one-line error naming the way out.
    failed = subprocess.run(cli + options, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert failed.returncode == 1
    assert "Scale" in failed.stderr and "--import MODULE" in failed.stderr
    assert "Traceback" not in failed.stderr
    done = subprocess.run(
        [*cli, *options, "--import", "user_layers"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    manifest = json.loads((tmp_path / "repo/sentiment/1/manifest.json").read_text())
    assert manifest["task"] == "classify" and manifest["labels"] == ["negative", "positive"]
    assert manifest["inputs"] == [{"name": "token_ids", "dtype": "int32", "shape": ["batch", 10]}]
    assert manifest["packer"]["sequence_length"] == 10
    url, stop = serve_in_thread(create_app(ModelRepository(tmp_path / "repo")))
    try:
        texts = ["a fine play", "dull and bad", "good"]
        response = httpx.post(
            f"{url}/v2/models/sentiment/classify", json={"text_input": texts}, timeout=60
        )
    finally:
        stop()
    assert response.status_code == 200, response.text
    expected = softmax(model.predict(tf.constant(texts), verbose=0))
    for answer, row in zip(response.json()["predictions"], expected, strict=True):
        assert answer["label"] == ["negative", "positive"][int(row.argmax())]
        assert abs(answer["scores"]["positive"] - row[1]) <= 1e-5


def test_cli_reports_bad_labels_and_missing_files(tmp_path, capsys):
    from keras_attn_export.cli import main

    assert main(["nope.keras", str(tmp_path / "out")]) == 1
    assert "no such model file: 'nope.keras'" in capsys.readouterr().err
    (tmp_path / "m.keras").write_bytes(b"")
    assert main([str(tmp_path / "m.keras"), str(tmp_path / "out"), "--labels", "a,,b"]) == 1
    assert "`--labels` must name non-empty labels" in capsys.readouterr().err
    # A file that exists but is no zip is named as such, not as missing (issue 19).
    (tmp_path / "m.keras").write_text("not a zip")
    assert main([str(tmp_path / "m.keras"), str(tmp_path / "out")]) == 1
    assert "m.keras' is not a .keras archive (a zip file" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("tied", [True, False])
def test_functional_causal_lm_exports_decode_graphs_and_generates(toy_tokenizer, tied, tmp_path):
    from keras_attn_export import export_model
    from keras_attn_serving import Predictor

    from keras_attn.models import generate
    from tests.models.test_generation import functional_lm

    model = functional_lm(vocabulary=toy_tokenizer.vocabulary_size(), length=24, tied=tied)
    manifest = export_model(
        model, tmp_path / "lm", tokenizer=toy_tokenizer, task="generate", formats=["onnx"],
        verbose=False,
    )  # fmt: skip
    decoding = manifest["decoding"]
    assert manifest["task"] == "generate" and decoding["greedy_equals_keras"]
    assert decoding["gqa"]["file"] == "decode_gqa.onnx"
    assert decoding["gqa"]["step_logits_max_abs_diff"] <= 1e-4
    prompts = [[5, 6, 7], [9, 3, 12, 4]]
    assert Predictor(tmp_path / "lm").generate_ids(prompts, 6) == generate(model, prompts, 6)
    if not tied:
        return
    # /generate over HTTP: the text of the Keras model's greedy ids on the tokenized prompt.
    (tmp_path / "repo" / "lm").mkdir(parents=True)
    (tmp_path / "lm").rename(tmp_path / "repo" / "lm" / "1")
    url, stop = serve_in_thread(create_app(ModelRepository(tmp_path / "repo")))
    try:
        body = {"text_input": "to be or not", "parameters": {"max_tokens": 5}}
        response = httpx.post(f"{url}/v2/models/lm/generate", json=body, timeout=60)
    finally:
        stop()
    assert response.status_code == 200, response.text
    prompt = toy_tokenizer.tokenize("to be or not").numpy().tolist()
    new = generate(model, [prompt], 5)[0]
    expected = toy_tokenizer.detokenize(prompt + new).numpy().decode()
    assert response.json()["token_ids"] == new
    assert response.json()["text_output"] == expected[len("to be or not") :].lstrip()


def test_generate_task_needs_a_causal_lm_of_our_layers(trained, tmp_path):
    from keras_attn_export import export_model

    model, _, _ = trained
    with pytest.raises(ValueError, match="is not a causal LM made of"):
        export_model(model, tmp_path / "x", task="generate", verbose=False)


def test_parity_fails_on_nan_and_tolerances_are_checked(tmp_path):
    """A model whose outputs hold NaN never exports as green; NaN or negative tolerances are
    refused (issue 19: `>` comparisons let both through)."""
    from keras_attn_export import ParityError, export_model
    from keras_attn_export.parity import check

    rows = [{"output": "logits", "batch": 1, "seq": 7, "onnx_vs_keras": float("nan")}]
    with pytest.raises(ParityError):
        check(rows, 1e-4)
    ids = keras.Input((None,), dtype="int32", name="token_ids")
    x = ka.TokenEmbedding(20, 8)(ids)
    nan_model = keras.Model(ids, keras.layers.Lambda(lambda t: t * float("nan"))(x))
    with pytest.raises(ParityError, match="nan"):
        export_model(nan_model, tmp_path / "nan", formats=["onnx"], verbose=False)
    for bad in (float("nan"), -1.0, float("inf"), {"logits": -0.5}):
        with pytest.raises(ValueError, match="`tolerance` must be a finite number >= 0"):
            export_model(nan_model, tmp_path / "t", tolerance=bad, verbose=False)
    assert not (tmp_path / "nan").exists() and not (tmp_path / "t").exists()


def test_strings_in_model_exports_serve_text_equal_to_its_predict(trained, tmp_path):
    from keras_attn_export import export_model
    from keras_attn_export.saved_model import TEXT_SIGNATURE, load_signature

    model, _, _ = trained
    manifest = export_model(model, tmp_path / "m", task="classify", verbose=False)
    assert manifest["parity"]["serve_text_vs_serving_default"] == 0.0
    texts = ["a fine play", "dull and bad", "good fine play and a fine good play"]
    served = load_signature(tmp_path / "m" / "saved_model", TEXT_SIGNATURE)(text=tf.constant(texts))
    expected = model.predict(tf.constant(texts), verbose=0)
    np.testing.assert_allclose(served["logits"].numpy(), expected, atol=1e-5)


@pytest.mark.slow
def test_functional_tagger_and_embedder_are_served_by_tag_and_embed(trained, tmp_path):
    """A user's per-token model (`task="tag"`) and its sequence output (`task="embed"`, one
    rank-3 output, mean-pooled by the server) over HTTP, equal to Keras on the same ids."""
    from keras_attn_export import export_model

    from keras_attn.preprocessing import StartEndPacker

    _, tokenizer, _ = trained
    keras.utils.set_random_seed(2)
    ids = keras.Input((None,), dtype="int32", name="token_ids")
    hidden = ka.TokenAndPositionEmbedding(tokenizer.vocabulary_size(), 16, 16, mask_zero=True)(ids)
    hidden = ka.TransformerEncoder(num_heads=2, intermediate_dim=32)(hidden)
    tagger = keras.Model(ids, keras.layers.Dense(3, name="tags")(hidden))
    embedder = keras.Model(ids, hidden)
    packer = StartEndPacker(
        16, start_value=tokenizer.token_to_id("[CLS]"), end_value=tokenizer.token_to_id("[SEP]")
    )
    for name, model, task in (("tagger", tagger, "tag"), ("embedder", embedder, "embed")):
        export_model(
            model, tmp_path / "repo" / name / "1", tokenizer=tokenizer, packer=packer,
            formats=["onnx"], task=task, labels=["O", "B", "I"] if task == "tag" else None,
            verbose=False,
        )  # fmt: skip
    texts = ["a fine play", "dull"]
    url, stop = serve_in_thread(create_app(ModelRepository(tmp_path / "repo")))
    try:
        tags = httpx.post(f"{url}/v2/models/tagger/tag", json={"text_input": texts}, timeout=60)
        vectors = httpx.post(f"{url}/v2/models/embedder/embed", json={"text_input": texts},
                             timeout=60)  # fmt: skip
    finally:
        stop()
    assert tags.status_code == 200 and vectors.status_code == 200, (tags.text, vectors.text)
    packed = np.asarray(packer(tokenizer(tf.constant(texts))))
    packed = packed[:, : int((packed != 0).sum(1).max())]
    logits = np.asarray(tagger(packed))
    for row, answer in enumerate(tags.json()["predictions"]):
        real = [i for i, t in enumerate(packed[row]) if t not in (0, 2, 3)]
        assert [a["label"] for a in answer] == [
            ["O", "B", "I"][logits[row, i].argmax()] for i in real
        ]
    hidden_states = np.asarray(embedder(packed), "float64")
    real = (packed != 0)[..., None]
    expected = (hidden_states * real).sum(1) / real.sum(1)
    np.testing.assert_allclose(np.array(vectors.json()["embeddings"]), expected, atol=1e-5)


def test_cli_tokenizer_flag_adds_a_vocabulary_to_an_ids_model(toy_tokenizer, tmp_path, capsys):
    from keras_attn_export.cli import main

    keras.utils.set_random_seed(3)
    ids = keras.Input((None,), dtype="int32", name="token_ids")
    x = ka.TokenAndPositionEmbedding(toy_tokenizer.vocabulary_size(), 16, 8, mask_zero=True)(ids)
    x = keras.layers.GlobalAveragePooling1D()(ka.TransformerEncoder(2, 16)(x))
    keras.Model(ids, keras.layers.Dense(2)(x)).save(tmp_path / "m.keras")
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(toy_tokenizer.get_vocabulary()) + "\n", encoding="utf-8")
    options = ["--formats", "onnx", "--tokenizer", str(vocab), "--task", "classify"]
    code = main([str(tmp_path / "m.keras"), str(tmp_path / "out"), *options,
                 "--labels", '["no", "yes"]'])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["task"] == "classify" and manifest["labels"] == ["no", "yes"]
    exported = (tmp_path / "out" / "tokenizer" / "vocab.txt").read_text(encoding="utf-8")
    assert exported.split("\n")[:-1] == toy_tokenizer.get_vocabulary()
