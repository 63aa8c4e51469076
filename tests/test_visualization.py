import keras
import numpy as np
import pytest

from keras_attn.visualization import attention_maps, plot_attention
from tests.models.model_cases import ENCODER_INPUTS, SEQ2SEQ_INPUTS, TOKENS, build


def test_encoder_maps_are_softmax_rows_that_skip_padding():
    model, inputs, _ = build("classifier_cls")  # a head: its encoder's blocks are mapped
    maps = attention_maps(model, inputs)
    assert list(maps) == ["encoder_block_0"]
    weights = maps["encoder_block_0"]["self"]
    assert weights.shape == (2, 2, 6, 6)
    np.testing.assert_allclose(weights[1].sum(-1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(weights[0, :, :5, 5], 0.0)  # the pad key gets no weight
    # The maps come from the model's own layers: replaying them gives the model's output.
    sequence = keras.ops.convert_to_numpy(model.backbone(inputs)["sequence_output"])
    block = model.backbone.get_layer("encoder_block_0")
    x = model.backbone.get_layer("embeddings")(TOKENS, ENCODER_INPUTS["segment_ids"])
    out = keras.ops.convert_to_numpy(block(x, padding_mask=TOKENS != 0))
    np.testing.assert_allclose(out[TOKENS != 0], sequence[TOKENS != 0], atol=1e-5)


def test_causal_and_seq2seq_maps():
    lm, tokens, _ = build("causal_lm")
    weights = attention_maps(lm, tokens)["decoder_block_0"]["self"]
    assert np.abs(np.triu(weights, k=1)).max() == 0.0  # nothing attends to the future
    model, inputs, _ = build("seq2seq_shared")
    maps = attention_maps(model, inputs)
    assert list(maps) == ["encoder_block_0", "decoder_block_0", "decoder_block_1"]
    cross = maps["decoder_block_1"]["cross"]
    assert cross.shape == (2, 2, 5, 4)
    np.testing.assert_array_equal(cross[0, :, :, 3], 0.0)  # padded source position
    np.testing.assert_allclose(cross.sum(-1)[1], 1.0, atol=1e-5)
    assert maps["decoder_block_0"]["self"].shape == (2, 2, 5, 5)
    assert SEQ2SEQ_INPUTS["encoder_token_ids"][0, 3] == 0
    with pytest.raises(ValueError, match="is not a causal LM made of"):
        attention_maps(keras.Sequential([keras.layers.Dense(2)]), np.zeros((1, 2)))


def test_plot_attention_writes_a_png_with_token_labels(tmp_path):
    import matplotlib.pyplot as plt

    weights = np.array([[[1.0, 0.0, 0.0], [0.5, 0.5, 0.0]], [[0.2, 0.3, 0.5], [0.0, 0.0, 1.0]]])
    path = tmp_path / "attention.png"
    fig = plot_attention(weights, ["the", "cat"], ["le", "chat", "noir"], path, title="cross")
    try:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert len(fig.axes) == 3  # two heads and the colour bar
        assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["le", "chat", "noir"]
        assert [t.get_text() for t in fig.axes[1].get_yticklabels()] == ["the", "cat"]
        image = fig.axes[1].images[0].get_array()
        np.testing.assert_allclose(image, weights[1])
    finally:
        plt.close(fig)
    with pytest.raises(ValueError, match="query_tokens"):
        plot_attention(weights, ["a"], ["b", "c", "d"], tmp_path / "bad.png")
