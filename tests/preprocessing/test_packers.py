import numpy as np
import pytest
import tensorflow as tf

from keras_attn.preprocessing import MaskedLMMaskGenerator, SegmentPacker, StartEndPacker

pytestmark = pytest.mark.tf_only
CLS, SEP, MASK, BOS, EOS = 2, 3, 4, 5, 6


def test_start_end_packer_adds_truncates_and_pads():
    packer = StartEndPacker(6, start_value=BOS, end_value=EOS, return_padding_mask=True)
    ids, mask = packer(tf.ragged.constant([[10, 11], [10, 11, 12, 13, 14, 15]]))
    np.testing.assert_array_equal(ids, [[BOS, 10, 11, EOS, 0, 0], [BOS, 10, 11, 12, 13, EOS]])
    np.testing.assert_array_equal(mask, [[1, 1, 1, 1, 0, 0], [1] * 6])
    np.testing.assert_array_equal(StartEndPacker(3)([7, 8, 9, 10]), [7, 8, 9])


def test_start_end_packer_in_dataset_map():
    packer = StartEndPacker(4, end_value=EOS)
    ds = tf.data.Dataset.from_tensor_slices(tf.ragged.constant([[9], [8, 7, 6, 5]])).batch(2)
    np.testing.assert_array_equal(next(iter(ds.map(packer))), [[9, EOS, 0, 0], [8, 7, 6, EOS]])


@pytest.mark.parametrize(
    ("truncate", "expected"),
    [
        ("round_robin", [CLS, 10, 11, SEP, 20, 21, SEP]),
        ("longest_first", [CLS, 10, 11, SEP, 20, 21, SEP]),  # (3, 4) -> (3, 3) -> (2, 3) -> (2, 2)
        ("waterfall", [CLS, 10, 11, 12, SEP, 20, SEP]),
    ],
)
def test_segment_packer_truncation_strategies(truncate, expected):
    packer = SegmentPacker(7, CLS, SEP, truncate=truncate)
    out = packer((tf.ragged.constant([[10, 11, 12]]), tf.ragged.constant([[20, 21, 22, 23]])))
    np.testing.assert_array_equal(out["token_ids"][0], expected)
    sep = expected.index(SEP)
    np.testing.assert_array_equal(out["segment_ids"][0], [0] * (sep + 1) + [1] * (6 - sep))
    assert out["padding_mask"].numpy().all()


def test_segment_packer_pads_short_pairs():
    out = SegmentPacker(8, CLS, SEP)(([[10]], [[20, 21]]))
    np.testing.assert_array_equal(out["token_ids"], [[CLS, 10, SEP, 20, 21, SEP, 0, 0]])
    np.testing.assert_array_equal(out["segment_ids"], [[0, 0, 0, 1, 1, 1, 0, 0]])
    np.testing.assert_array_equal(out["padding_mask"], [[1] * 6 + [0, 0]])


def test_masked_lm_rates_and_special_tokens_never_selected():
    tf.random.set_seed(0)
    gen = MaskedLMMaskGenerator(
        vocabulary_size=1000,
        mask_token_id=MASK,
        mask_selection_length=40,
        unselectable_token_ids=[0, CLS, SEP],
    )
    ids = np.full((64, 128), 500, "int32")
    ids[:, 0], ids[:, 99] = CLS, SEP
    ids[:, 100:] = 0  # trailing padding
    out = gen(ids)
    weights = out["mask_weights"].numpy()
    positions = out["mask_positions"].numpy()
    chosen = weights.sum() / (64 * 98)  # 98 selectable tokens per row
    assert 0.12 < chosen < 0.18
    picked = positions[weights > 0]
    assert np.isin(ids[np.nonzero(weights)[0], picked], [500]).all()  # never CLS/SEP/PAD
    masked = out["token_ids"].numpy()
    new = masked[np.nonzero(weights)[0], picked]
    assert 0.74 < (new == MASK).mean() < 0.86
    assert 0.05 < (new == 500).mean() < 0.15  # kept (random ids rarely hit 500)
    np.testing.assert_array_equal(out["mask_ids"].numpy()[weights > 0], 500)
    unselected = np.ones_like(masked, bool)
    unselected[np.nonzero(weights)[0], picked] = False
    np.testing.assert_array_equal(masked[unselected], ids[unselected])  # nothing else changed


@pytest.mark.parametrize(
    ("cls", "kwargs", "arg"),
    [
        (StartEndPacker, {"sequence_length": 0}, "sequence_length"),
        (StartEndPacker, {"sequence_length": 2, "start_value": 1, "end_value": 2},
         "sequence_length"),
        (SegmentPacker, {"sequence_length": 8, "start_value": 2, "end_value": 3,
                         "truncate": "random"}, "truncate"),
        (MaskedLMMaskGenerator, {"vocabulary_size": 10, "mask_token_id": 10,
                                 "mask_selection_length": 2}, "mask_token_id"),
        (MaskedLMMaskGenerator, {"vocabulary_size": 10, "mask_token_id": 4,
                                 "mask_selection_length": 2, "mask_token_rate": 0.95},
         "random_token_rate"),
    ],
)  # fmt: skip
def test_bad_arguments(cls, kwargs, arg):
    with pytest.raises(ValueError, match=arg):
        cls(**kwargs)


def test_bad_inputs():
    with pytest.raises(ValueError, match="integer"):
        StartEndPacker(4)(tf.constant([["a"]]))
    with pytest.raises(ValueError, match="segments"):
        SegmentPacker(8, CLS, SEP)(tf.constant([[1, 2]]))
    with pytest.raises(ValueError, match="room"):
        SegmentPacker(4, CLS, SEP)(([[1]], [[2]]))
