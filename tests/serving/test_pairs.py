"""The server's pair trimmers equal tensorflow-text's, which the Keras `SegmentPacker` runs."""

import itertools

import pytest
from keras_attn_serving.pairs import pack_pair, trim

pytestmark = pytest.mark.tf_only


@pytest.mark.parametrize("rule", ["round_robin", "longest_first", "waterfall"])
def test_trim_equals_tensorflow_text(rule):
    import tensorflow as tf

    from keras_attn.preprocessing.packers import TRUNCATE

    cases = list(itertools.product(range(9), range(9), range(2, 12)))
    first = tf.ragged.constant([[1] * a for a, _, _ in cases], dtype=tf.int32)
    second = tf.ragged.constant([[2] * b for _, b, _ in cases], dtype=tf.int32)
    for budget in range(2, 12):
        trimmed = TRUNCATE[rule](budget).trim([first, second])
        got = list(zip(*(t.row_lengths().numpy().tolist() for t in trimmed), strict=True))
        mine = [tuple(trim([a, b], budget, rule)) for a, b, _ in cases]
        assert got == mine, rule


def test_pack_pair_places_the_specials_and_segments():
    ids, segments = pack_pair([5, 6, 7], [8, 9], 7, 2, 3, "round_robin")
    assert ids == [2, 5, 6, 3, 8, 9, 3] and segments == [0, 0, 0, 0, 1, 1, 1]
    with pytest.raises(ValueError, match="unknown truncation rule"):
        trim([5, 5], 4, "random")
