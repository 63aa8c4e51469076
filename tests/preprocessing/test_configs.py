"""Every tokenizer and preprocessing layer: all __init__ arguments in get_config, round trip."""

import inspect

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_attn.preprocessing import MaskedLMMaskGenerator, SegmentPacker, StartEndPacker
from keras_attn.tokenizers import (
    SPECIAL_TOKENS,
    ByteTokenizer,
    UnicodeCharTokenizer,
    WordPieceTokenizer,
)

pytestmark = pytest.mark.tf_only
VOCAB = [*SPECIAL_TOKENS, "hello", "world"]

CASES = [
    (ByteTokenizer, {"lowercase": True, "sequence_length": 5, "special_tokens": ["[PAD]"]},
     tf.constant(["Hi there"])),
    (UnicodeCharTokenizer, {"vocabulary_size": 300, "lowercase": True,
                            "normalization_form": "NFC", "sequence_length": 4,
                            "special_tokens": ["[PAD]", "[UNK]"]}, tf.constant(["Héllo"])),
    (WordPieceTokenizer, {"vocabulary": VOCAB, "lowercase": False, "sequence_length": 3,
                          "special_tokens": list(SPECIAL_TOKENS), "max_bytes_per_word": 50},
     tf.constant(["hello world"])),
    (StartEndPacker, {"sequence_length": 5, "start_value": 5, "end_value": 6, "pad_value": 0,
                      "return_padding_mask": False}, tf.ragged.constant([[9, 9]])),
    (SegmentPacker, {"sequence_length": 8, "start_value": 2, "end_value": 3, "pad_value": 0,
                     "truncate": "waterfall"},
     (tf.ragged.constant([[9, 9]]), tf.ragged.constant([[8]]))),
]  # fmt: skip
MLM = {
    "vocabulary_size": 50,
    "mask_token_id": 4,
    "mask_selection_length": 3,
    "mask_selection_rate": 0.2,
    "mask_token_rate": 0.7,
    "random_token_rate": 0.2,
    "unselectable_token_ids": [0, 2, 3],
}


@pytest.mark.parametrize(
    ("cls", "kwargs"), [(c, k) for c, k, _ in CASES] + [(MaskedLMMaskGenerator, MLM)]
)
def test_every_init_argument_is_in_get_config(cls, kwargs):
    base = set(inspect.signature(keras.layers.Layer.__init__).parameters)
    params = [
        p
        for p in inspect.signature(cls.__init__).parameters.values()
        if p.name not in base and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
    ]
    assert {p.name for p in params} <= set(kwargs)
    config = cls(**kwargs).get_config()
    for p in params:
        assert p.name in config
        if p.name != "vocabulary":  # travels as an asset file, not in the config
            assert config[p.name] == kwargs[p.name], p.name


@pytest.mark.parametrize(("cls", "kwargs", "inputs"), CASES)
def test_config_round_trip_gives_the_same_output(cls, kwargs, inputs):
    layer = cls(**kwargs)
    clone = cls.from_config(layer.get_config())
    if isinstance(layer, WordPieceTokenizer):
        clone.set_vocabulary(layer.get_vocabulary())
    a, b = layer(inputs), clone(inputs)
    for x, y in zip(tf.nest.flatten(a), tf.nest.flatten(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
