import math

import numpy as np
import pytest

import keras_attn as ka
from tests.helpers import to_numpy


@pytest.mark.parametrize("dim", [6, 7])
def test_sinusoidal_encoding_equals_the_closed_form(dim):
    enc = to_numpy(ka.SinusoidalPositionEncoding()(np.zeros((1, 50, dim), "float32")))[0]
    for pos, i in [(0, 0), (1, 0), (3, 1), (7, 2), (20, 4), (49, dim - 1), (33, dim - 2)]:
        angle = pos / 10000 ** ((i - i % 2) / dim)
        expected = math.sin(angle) if i % 2 == 0 else math.cos(angle)
        assert enc[pos, i] == pytest.approx(expected, abs=1e-5), (pos, i)
    np.testing.assert_allclose(enc[0], [0, 1] * (dim // 2) + [0] * (dim % 2), atol=1e-7)


def test_sinusoidal_start_index_shifts_positions():
    layer = ka.SinusoidalPositionEncoding()
    full = to_numpy(layer(np.zeros((2, 10, 8), "float32")))
    tail = to_numpy(layer(np.zeros((2, 3, 8), "float32"), start_index=7))
    np.testing.assert_allclose(tail, full[:, 7:], atol=1e-6)


def test_token_embedding_mask_and_tied_reverse_projection():
    emb = ka.TokenEmbedding(10, 4, mask_zero=True)
    tokens = np.array([[3, 1, 0]])
    h = emb(tokens)
    table = to_numpy(emb.embeddings)
    np.testing.assert_allclose(to_numpy(h)[0], table[[3, 1, 0]])
    np.testing.assert_array_equal(to_numpy(emb.compute_mask(tokens)), [[True, True, False]])
    logits = to_numpy(emb(h, reverse=True))
    np.testing.assert_allclose(logits, to_numpy(h) @ table.T, rtol=1e-5, atol=1e-6)
    assert logits.shape == (1, 3, 10)
    with pytest.raises(ValueError, match="embedding_dim"):
        emb(np.ones((1, 3, 5), "float32"), reverse=True)


def test_position_embedding_slices_the_table():
    layer = ka.PositionEmbedding(8)
    out = to_numpy(layer(np.zeros((2, 5, 3), "float32")))
    table = to_numpy(layer.position_embeddings)
    np.testing.assert_allclose(out, np.broadcast_to(table[:5], (2, 5, 3)))
    np.testing.assert_allclose(
        to_numpy(layer(np.zeros((2, 2, 3), "float32"), start_index=4))[0], table[4:6]
    )
    with pytest.raises(ValueError, match="sequence_length"):
        ka.PositionEmbedding(4)(np.zeros((1, 5, 3), "float32"))


def _rope_numpy(x, positions, base=10000.0):
    d = x.shape[-1]
    inv = base ** (-np.arange(0, d, 2) / d)
    ang = positions[:, None] * inv  # (T, d/2)
    cos, sin = np.cos(ang), np.sin(ang)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    cos, sin = cos[:, None, :], sin[:, None, :]  # broadcast over heads
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def test_rotary_matches_numpy_and_keeps_norms():
    x = np.random.default_rng(0).normal(size=(2, 5, 3, 8)).astype("float32")
    out = to_numpy(ka.RotaryEmbedding()(x, start_index=2))
    np.testing.assert_allclose(out, _rope_numpy(x, np.arange(2, 7.0)), atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(out, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-5)


def test_rotary_scores_depend_only_on_relative_position():
    rng = np.random.default_rng(1)
    q, k = rng.normal(size=(8,)).astype("float32"), rng.normal(size=(8,)).astype("float32")
    rope = ka.RotaryEmbedding()

    def at(v, pos):
        return to_numpy(rope(np.tile(v, (1, pos + 1, 1, 1)).reshape(1, pos + 1, 1, 8)))[0, pos, 0]

    assert at(q, 5) @ at(k, 2) == pytest.approx(at(q, 9) @ at(k, 6), rel=1e-4)
    assert at(q, 5) @ at(k, 2) != pytest.approx(at(q, 5) @ at(k, 4), rel=1e-3)


def test_rotary_rejects_odd_width():
    with pytest.raises(ValueError, match="even"):
        ka.RotaryEmbedding()(np.zeros((1, 4, 5), "float32"))


@pytest.mark.parametrize("position_encoding", ["learned", "sinusoidal"])
def test_token_and_position_embedding_is_the_sum(position_encoding):
    layer = ka.TokenAndPositionEmbedding(
        20, 8, 6, num_segments=2, position_encoding=position_encoding, mask_zero=True
    )
    tokens = np.array([[4, 5, 6, 0], [7, 8, 9, 10]])
    segments = np.array([[0, 0, 1, 1], [0, 1, 1, 1]])
    out = to_numpy(layer(tokens, segments))
    tok = to_numpy(layer.token_embedding.embeddings)[tokens]
    if position_encoding == "learned":
        pos = to_numpy(layer.position_embedding.position_embeddings)[:4]
    else:
        pos = to_numpy(ka.sinusoidal_encoding(np.arange(4.0), 6))
    seg = to_numpy(layer.segment_embedding.embeddings)[segments]
    np.testing.assert_allclose(out, tok + pos + seg, atol=1e-6)
    np.testing.assert_array_equal(to_numpy(layer.compute_mask(tokens)), tokens != 0)


def test_token_and_position_embedding_layer_norm():
    layer = ka.TokenAndPositionEmbedding(20, 8, 6, use_layer_norm=True)
    out = to_numpy(layer(np.array([[1, 2, 3]])))
    np.testing.assert_allclose(out.mean(-1), 0.0, atol=1e-5)
    np.testing.assert_allclose(out.std(-1), 1.0, atol=1e-3)


def test_token_and_position_embedding_errors():
    with pytest.raises(ValueError, match="position_encoding"):
        ka.TokenAndPositionEmbedding(20, 8, 6, position_encoding="alibi")
    with pytest.raises(ValueError, match="num_segments"):
        ka.TokenAndPositionEmbedding(20, 8, 6)(np.array([[1, 2]]), np.array([[0, 1]]))
    with pytest.raises(ValueError, match="sequence_length"):
        ka.TokenAndPositionEmbedding(20, 4, 6)(np.ones((1, 5), "int32"))
    with pytest.raises(ValueError, match="token_ids"):
        ka.TokenAndPositionEmbedding(20, 4, 6)(np.ones((1, 2, 3), "int32"))


@pytest.mark.parametrize(
    ("cls", "kwargs", "arg"),
    [
        (ka.TokenEmbedding, {"vocabulary_size": 0, "embedding_dim": 4}, "vocabulary_size"),
        (ka.TokenEmbedding, {"vocabulary_size": 5, "embedding_dim": 2.0}, "embedding_dim"),
        (ka.SegmentEmbedding, {"num_segments": 0, "embedding_dim": 4}, "num_segments"),
        (ka.PositionEmbedding, {"sequence_length": -1}, "sequence_length"),
        (ka.SinusoidalPositionEncoding, {"max_wavelength": 1}, "max_wavelength"),
        (ka.RotaryEmbedding, {"scaling_factor": 0}, "scaling_factor"),
        (
            ka.TokenAndPositionEmbedding,
            {"vocabulary_size": 5, "sequence_length": 4, "embedding_dim": 4, "dropout": 2},
            "dropout",
        ),
    ],
)
def test_bad_arguments(cls, kwargs, arg):
    with pytest.raises(ValueError, match=arg):
        cls(**kwargs)
