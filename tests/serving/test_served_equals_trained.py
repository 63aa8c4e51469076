"""What is served is what was trained: a MiniLM classifier fine-tuned on raw tweets through its
preprocessor, saved, exported with the CLI, and served, answers as Keras `predict` does on the
same raw text. Before the task carried its preprocessor, this path exported `"packer": null`
and the server tokenized without [CLS]/[SEP]: probabilities off by up to 0.13, silently."""

import httpx
import keras
import numpy as np
import pytest
from keras_attn_export.cli import main as export_cli
from keras_attn_serving.server import ModelRepository, create_app
from keras_attn_serving.text import softmax

from keras_attn.data import checkpoint_folder, load_tweet_sentiment
from keras_attn.models import SequenceClassifier
from tests.serving.test_server import serve_in_thread

pytestmark = [pytest.mark.tf_only, pytest.mark.slow]
LABELS = ["negative", "neutral", "positive"]


@pytest.fixture(scope="module")
def fine_tuned(tmp_path_factory):
    keras.utils.set_random_seed(0)
    train, _ = load_tweet_sentiment()
    texts, labels = zip(*train[:48], strict=True)
    model = SequenceClassifier.from_pretrained(
        checkpoint_folder(), num_classes=3, sequence_length=48, dropout=0.0,
        backbone_kwargs={"dropout": 0.0},
    )  # fmt: skip
    model.compile(optimizer=keras.optimizers.Adam(5e-5))
    model.fit(list(texts), np.array(labels), batch_size=16, epochs=1, verbose=0)
    path = tmp_path_factory.mktemp("trained") / "clf.keras"
    model.save(path)
    return model, path


def test_cli_export_serves_what_the_model_was_trained_on(fine_tuned, tmp_path):
    model, path = fine_tuned
    root = tmp_path / "repository"
    # The new user's command of the issue, less `--tokenizer`: the task carries its own.
    assert export_cli([str(path), str(root / "clf" / "1"), "--labels", ",".join(LABELS)]) == 0
    _, _, manifest_text = (root / "clf" / "1" / "manifest.json").read_text().partition("packer")
    assert '"type": "segment"' in manifest_text.split("}")[0]
    tweets = [text for text, _ in load_tweet_sentiment()[1][:20]]
    expected = softmax(model.predict(tweets, verbose=0))
    url, stop = serve_in_thread(create_app(ModelRepository(root)))
    try:
        response = httpx.post(f"{url}/v2/models/clf/classify", json={"text_input": tweets},
                              timeout=120)  # fmt: skip
    finally:
        stop()
    assert response.status_code == 200, response.text
    got = np.array([[p["scores"][label] for label in LABELS]
                    for p in response.json()["predictions"]])  # fmt: skip
    np.testing.assert_allclose(got, expected, atol=1e-5)
    # The tokenizer the user named before is refused: the model says how it tokenizes.
    assert export_cli([str(path), str(tmp_path / "again"), "--tokenizer",
                       str(checkpoint_folder())]) == 1  # fmt: skip
    assert not (tmp_path / "again").exists()


def test_a_second_tokenizer_is_refused_naming_the_preprocessor(fine_tuned, tmp_path):
    from keras_attn_export import export_model

    model, _ = fine_tuned
    with pytest.raises(ValueError, match=r"its `preprocessor`.*do not pass `tokenizer`"):
        export_model(model, tmp_path / "x", tokenizer=model.preprocessor.tokenizer)


def test_a_tokenizer_without_packer_for_a_two_input_model_is_refused(fine_tuned, tmp_path):
    """The silent case: ids without [CLS]/[SEP] into a model trained with them."""
    from keras_attn_export import export_model

    model, _ = fine_tuned
    bare = SequenceClassifier(model.backbone, 3, dropout=0.0)
    with pytest.raises(ValueError, match="without the packer the model was trained with"):
        export_model(bare, tmp_path / "x", tokenizer=model.preprocessor.tokenizer)


def test_raw_text_without_a_preprocessor_names_the_fix(fine_tuned):
    model, _ = fine_tuned
    bare = SequenceClassifier(model.backbone, 3, dropout=0.0)
    with pytest.raises(ValueError, match="has no preprocessor to tokenize it"):
        bare.predict(["a tweet"], verbose=0)


def test_embed_applies_the_checkpoints_own_pooling_by_default(tmp_path):
    """all-MiniLM-L6-v2's folder says mean pooling, then L2 normalization: `/embed` returned
    unnormalized vectors before. A request's `parameters` still override it."""
    from keras_attn_export import export_model

    from keras_attn.models import Encoder
    from keras_attn.preprocessing import SegmentPacker, TextPreprocessor
    from keras_attn.tokenizers import WordPieceTokenizer

    encoder = Encoder.from_pretrained(checkpoint_folder(), dropout=0.0)
    assert encoder.embedding_pooling == {"pooling": "mean", "normalize": True}
    tokenizer = WordPieceTokenizer.from_pretrained(checkpoint_folder())
    encoder.preprocessor = TextPreprocessor(
        tokenizer, SegmentPacker(32, tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]"))
    )
    manifest = export_model(encoder, tmp_path / "repo" / "minilm" / "1", formats=["onnx"],
                            verbose=False)  # fmt: skip
    assert manifest.embedding.model_dump() == {"pooling": "mean", "normalize": True}
    texts = ["A man is playing a guitar.", "The weather is lovely today"]
    features = encoder.preprocessor(texts)
    inputs = {k: features[k] for k in ("token_ids", "segment_ids")}
    hidden = keras.ops.convert_to_numpy(encoder(inputs)["sequence_output"])
    real = keras.ops.convert_to_numpy(features["padding_mask"])[..., None]
    mean = (hidden * real).sum(1) / real.sum(1)
    url, stop = serve_in_thread(create_app(ModelRepository(tmp_path / "repo")))
    try:
        default = httpx.post(f"{url}/v2/models/minilm/embed", json={"text_input": texts},
                             timeout=60).json()["embeddings"]  # fmt: skip
        raw = httpx.post(
            f"{url}/v2/models/minilm/embed",
            timeout=60,
            json={"text_input": texts, "parameters": {"normalize": False}},
        ).json()["embeddings"]
    finally:
        stop()
    np.testing.assert_allclose(default, mean / np.linalg.norm(mean, axis=-1, keepdims=True),
                               atol=1e-5)  # fmt: skip
    np.testing.assert_allclose(raw, mean, atol=1e-4)
