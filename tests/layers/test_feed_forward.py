import math

import numpy as np
import pytest

import keras_attn as ka
from tests.helpers import to_numpy
from tests.layers import reference


@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh", "swish"])
def test_feed_forward_matches_numpy(activation):
    x = np.random.default_rng(0).normal(size=(2, 3, 5)).astype("float32")
    layer = ka.FeedForward(7, activation=activation, bias_initializer="random_normal")
    out = to_numpy(layer(x))
    np.testing.assert_allclose(
        out, reference.feed_forward(layer, x.astype("float64"), activation), atol=1e-5
    )


def test_gelu_pinned_values():
    x = np.array([-2.0, -0.5, 0.0, 1.0, 3.0], "float32")
    expected = [0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x]
    np.testing.assert_allclose(to_numpy(ka.gelu(x)), expected, atol=1e-6)
    np.testing.assert_allclose(to_numpy(ka.gelu(x))[3], 0.8413447, atol=1e-6)  # Φ(1)
    np.testing.assert_allclose(to_numpy(ka.gelu_tanh(x)), expected, atol=1e-3)


def test_feed_forward_is_position_wise():
    x = np.random.default_rng(1).normal(size=(1, 4, 5)).astype("float32")
    layer = ka.FeedForward(8)
    whole = to_numpy(layer(x))
    for t in range(4):
        np.testing.assert_allclose(to_numpy(layer(x[:, t : t + 1]))[:, 0], whole[:, t], atol=1e-6)


@pytest.mark.parametrize(
    ("kwargs", "arg"),
    [
        ({"intermediate_dim": 0}, "intermediate_dim"),
        ({"intermediate_dim": 4, "output_dim": -1}, "output_dim"),
        ({"intermediate_dim": 4, "activation": "gelu_exact"}, "activation"),
        ({"intermediate_dim": 4, "dropout": 1.0}, "dropout"),
    ],
)
def test_bad_arguments(kwargs, arg):
    with pytest.raises(ValueError, match=arg):
        ka.FeedForward(**kwargs)


def test_unknown_width_is_rejected():
    with pytest.raises(ValueError, match="inputs"):
        ka.FeedForward(4).build((2, 3, None))
    with pytest.raises(ValueError, match="inputs"):
        ka.SinusoidalPositionEncoding().build((2, 3, None))
    with pytest.raises(ValueError, match="inputs"):
        ka.PositionEmbedding(4).build((3,))
