import keras
import numpy as np
import pytest

import keras_attn as ka
from tests.helpers import to_numpy
from tests.layers import reference

RNG = np.random.default_rng(0)
X = RNG.normal(size=(2, 6, 16)).astype("float32")
ENC = RNG.normal(size=(2, 5, 12)).astype("float32")
PAD = np.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], bool)
ENC_PAD = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)


def randomize(layer, seed=1):
    """Random values for every weight (LayerNorm scales and biases too), so nothing is trivial."""
    rng = np.random.default_rng(seed)
    for v in layer.weights:
        v.assign(rng.normal(scale=0.3, size=v.shape).astype("float32"))


@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("normalize_first", [False, True])
def test_encoder_equals_numpy_reference(normalize_first, activation):
    block = ka.TransformerEncoder(
        4, 32, normalize_first=normalize_first, activation=activation, dropout=0.2
    )
    block(X)
    randomize(block)
    out = to_numpy(block(X, padding_mask=PAD))
    expected = reference.encoder(block, X.astype("float64"), key_padding=PAD)
    np.testing.assert_allclose(out, expected, atol=1e-5)
    out = to_numpy(block(X, use_causal_mask=True))
    expected = reference.encoder(block, X.astype("float64"), causal=True)
    np.testing.assert_allclose(out, expected, atol=1e-5)


@pytest.mark.parametrize("activation", ["gelu_tanh", "swish"])
@pytest.mark.parametrize("normalize_first", [False, True])
def test_decoder_with_cross_attention_equals_numpy_reference(normalize_first, activation):
    block = ka.TransformerDecoder(
        4, 32, normalize_first=normalize_first, activation=activation, num_key_value_heads=2
    )
    block(X, ENC)
    randomize(block)
    out = to_numpy(block(X, ENC, decoder_padding_mask=PAD, encoder_padding_mask=ENC_PAD))
    expected = reference.decoder(
        block, X.astype("float64"), ENC.astype("float64"), dec_padding=PAD, enc_padding=ENC_PAD
    )
    np.testing.assert_allclose(out, expected, atol=1e-5)


@pytest.mark.parametrize("normalize_first", [False, True])
def test_decoder_only_equals_numpy_reference(normalize_first):
    block = ka.TransformerDecoder(2, 24, normalize_first=normalize_first)
    block(X)
    randomize(block)
    np.testing.assert_allclose(
        to_numpy(block(X)), reference.decoder(block, X.astype("float64")), atol=1e-5
    )


def test_decoder_is_causal():
    block = ka.TransformerDecoder(4, 32)
    y = X.copy()
    y[:, 4:] = RNG.normal(size=(2, 2, 16))
    a, b = to_numpy(block(X)), to_numpy(block(y))
    np.testing.assert_allclose(a[:, :4], b[:, :4], atol=1e-6)
    assert not np.allclose(a[:, 4:], b[:, 4:])


def test_decoder_ignores_padded_encoder_positions():
    block = ka.TransformerDecoder(4, 32)
    enc2 = ENC.copy()
    enc2[0, 3:] = 100.0  # padded positions of the first row
    a = to_numpy(block(X, ENC, encoder_padding_mask=ENC_PAD))
    b = to_numpy(block(X, enc2, encoder_padding_mask=ENC_PAD))
    np.testing.assert_allclose(a, b, atol=1e-6)


def _stack(tokens_in):
    x = ka.TokenAndPositionEmbedding(30, 8, 16, mask_zero=True, name="emb")(tokens_in)
    x = ka.TransformerEncoder(4, 32, name="enc1")(x)
    x = ka.TransformerEncoder(4, 32, normalize_first=True, name="enc2")(x)
    return ka.TransformerDecoder(4, 32, name="dec")(x)


def test_mask_zero_padding_reaches_every_block_automatically():
    keras.utils.set_random_seed(0)
    tokens_in = keras.Input((None,), dtype="int32")
    model = keras.Model(tokens_in, _stack(tokens_in))
    tokens = np.array([[5, 6, 7, 0, 0], [1, 2, 3, 4, 9]])
    pad = tokens != 0
    auto = model.predict(tokens, verbose=0)
    emb = to_numpy(model.get_layer("emb")(tokens))
    # The same layers with an explicit padding mask: equal everywhere.
    x = emb
    for name in ("enc1", "enc2"):
        x = to_numpy(model.get_layer(name)(x, padding_mask=pad))
    explicit = to_numpy(model.get_layer("dec")(x, decoder_padding_mask=pad))
    np.testing.assert_allclose(auto, explicit, atol=1e-5)
    # With an explicit attention mask instead: equal at the real positions.
    am = np.broadcast_to(pad[:, None, :], (2, 5, 5))
    x = emb
    for name in ("enc1", "enc2"):
        x = to_numpy(model.get_layer(name)(x, attention_mask=am))
    explicit = to_numpy(model.get_layer("dec")(x, decoder_attention_mask=am))
    np.testing.assert_allclose(auto[pad], explicit[pad], atol=1e-5)
    # And the padding really matters: without any mask the real positions change.
    x = to_numpy(model.get_layer("emb")(tokens))
    for name in ("enc1", "enc2", "dec"):
        x = to_numpy(model.get_layer(name)(x))
    assert not np.allclose(auto[0, :3], x[0, :3], atol=1e-3)


def test_padded_row_equals_the_unpadded_sequence():
    keras.utils.set_random_seed(0)
    tokens_in = keras.Input((None,), dtype="int32")
    model = keras.Model(tokens_in, _stack(tokens_in))
    padded = model.predict(np.array([[5, 6, 7, 0, 0]]), verbose=0)
    alone = model.predict(np.array([[5, 6, 7]]), verbose=0)
    np.testing.assert_allclose(padded[:, :3], alone, atol=1e-5)


def test_attention_scores_are_returned():
    enc = ka.TransformerEncoder(4, 32)
    out, scores = enc(X, padding_mask=PAD, return_attention_scores=True)
    assert scores.shape == (2, 4, 6, 6)
    s = to_numpy(scores)
    row_sums = s.sum(-1).transpose(0, 2, 1)  # (B, T, H)
    np.testing.assert_allclose(row_sums[PAD], 1.0, rtol=1e-5)
    assert np.all(row_sums[~PAD] == 0.0)  # padded queries attend to nothing
    assert np.all(s[0, :, :, 4:] == 0.0)
    np.testing.assert_allclose(to_numpy(out), to_numpy(enc(X, padding_mask=PAD)), atol=1e-5)
    dec = ka.TransformerDecoder(4, 32)
    out, self_scores, cross_scores = dec(X, ENC, return_attention_scores=True)
    assert self_scores.shape == (2, 4, 6, 6) and cross_scores.shape == (2, 4, 6, 5)
    np.testing.assert_array_equal(np.triu(to_numpy(self_scores)[0, 0], 1), 0.0)


@pytest.mark.parametrize(
    ("kwargs", "arg"),
    [
        ({"num_heads": 0, "intermediate_dim": 8}, "num_heads"),
        ({"num_heads": 2, "intermediate_dim": -8}, "intermediate_dim"),
        ({"num_heads": 2, "intermediate_dim": 8, "dropout": 1.5}, "dropout"),
        ({"num_heads": 2, "intermediate_dim": 8, "attention_dropout": -1}, "attention_dropout"),
        ({"num_heads": 2, "intermediate_dim": 8, "activation": "tanhh"}, "activation"),
        ({"num_heads": 2, "intermediate_dim": 8, "layer_norm_epsilon": 0}, "layer_norm_epsilon"),
        ({"num_heads": 2, "intermediate_dim": 8, "score": "cosine"}, "score"),
        (
            {"num_heads": 2, "intermediate_dim": 8, "rope_max_wavelength": 0.5},
            "rope_max_wavelength",
        ),
        (
            {"num_heads": 2, "intermediate_dim": 8, "rope_max_wavelength": True},
            "rope_max_wavelength",
        ),
        (
            {
                "num_heads": 2,
                "intermediate_dim": 8,
                "rope_scaling": {"rope_type": "linear", "factor": 2.0},
            },
            "rope_max_wavelength",
        ),
        (
            {
                "num_heads": 2,
                "intermediate_dim": 8,
                "rope_max_wavelength": 1e4,
                "rope_scaling": {"rope_type": "yarn", "factor": 2.0},
            },
            "rope_scaling",
        ),
        (
            {
                "num_heads": 2,
                "intermediate_dim": 8,
                "rope_max_wavelength": 1e4,
                "rope_scaling": {"rope_type": "linear", "factor": -1},
            },
            "rope_scaling",
        ),
    ],
)
@pytest.mark.parametrize("cls", [ka.TransformerEncoder, ka.TransformerDecoder])
def test_bad_arguments(cls, kwargs, arg):
    with pytest.raises(ValueError, match=arg):
        cls(**kwargs)


def test_bad_shapes():
    with pytest.raises(ValueError, match="num_heads"):
        ka.TransformerEncoder(5, 8)(X)  # 16 is not divisible by 5
    with pytest.raises(ValueError, match="inputs"):
        ka.TransformerEncoder(2, 8)(X[0])
    dec = ka.TransformerDecoder(2, 8)
    dec(X)
    with pytest.raises(ValueError, match="encoder_sequence"):
        dec(X, ENC)
