"""Backbone / task / preprocessor: a task is its backbone plus a head, the shorthand builds the
same model, files from before the split load, and preprocessors make training batches of text."""

import keras
import numpy as np
import pytest

from keras_attn.models import (
    CausalLM,
    DecoderBackbone,
    EncoderBackbone,
    MaskedLM,
    Seq2SeqBackbone,
    Seq2SeqLM,
    SequenceClassifier,
)
from keras_attn.preprocessing import (
    CausalLMPreprocessor,
    MaskedLMMaskGenerator,
    MaskedLMPreprocessor,
    SegmentPacker,
    StartEndPacker,
)
from keras_attn.tokenizers import SPECIAL_TOKENS, WordPieceTokenizer
from tests.helpers import run_in_fresh_process, to_numpy
from tests.models.model_cases import SEQ2SEQ_INPUTS, TOKENS, VOCAB
from tests.models.test_models import _LOAD

SMALL = {"hidden_dim": 16, "num_layers": 1, "num_heads": 2}
WORDS = ["the", "cat", "sat", "on", "mat", "a", "dog", "ran"]
TEXT = ["the cat sat on the mat", "a dog ran", "the dog sat", "a cat ran on a mat"]


def test_causal_lm_is_its_backbone_then_the_tied_embedding():
    keras.utils.set_random_seed(0)
    backbone = DecoderBackbone(VOCAB, 16, **SMALL)
    lm = CausalLM(backbone)
    assert lm.backbone is backbone
    assert lm.decoder_blocks is backbone.decoder_blocks
    assert lm.token_embedding is backbone.token_embedding
    assert (lm.hidden_dim, lm.max_sequence_length) == (16, 16)  # the backbone's, through the task
    hidden = to_numpy(backbone(TOKENS)).astype("float64")
    table = to_numpy(backbone.token_embedding.embeddings).astype("float64")
    np.testing.assert_allclose(to_numpy(lm(TOKENS)), hidden @ table.T, atol=1e-5)
    # The shorthand builds the same model: same weights, same logits.
    short = CausalLM(VOCAB, 16, **SMALL)
    short.set_weights(lm.get_weights())
    np.testing.assert_allclose(to_numpy(short(TOKENS)), to_numpy(lm(TOKENS)), atol=1e-6)
    # The padding mask leaves the backbone with the task's logits (Keras's losses read it).
    mask = lm(keras.ops.convert_to_tensor(TOKENS))._keras_mask
    np.testing.assert_array_equal(to_numpy(mask), TOKENS != 0)


def test_seq2seq_lm_is_its_backbone_then_the_tied_embedding():
    keras.utils.set_random_seed(0)
    backbone = Seq2SeqBackbone(VOCAB, 16, hidden_dim=16, num_heads=2, position_encoding="learned")
    model = Seq2SeqLM(backbone)
    hidden = to_numpy(backbone(SEQ2SEQ_INPUTS)).astype("float64")
    table = to_numpy(backbone.token_embedding.embeddings).astype("float64")
    np.testing.assert_allclose(to_numpy(model(SEQ2SEQ_INPUTS)), hidden @ table.T, atol=1e-5)
    assert model.decoder_blocks is backbone.decoder_blocks
    # Learned positions bound the target length (the table has 16 rows).
    assert model.max_length == 16
    with pytest.raises(ValueError, match=r"past the model's context length 16"):
        model.generate([[5, 6]], 16, start_id=1)


def test_a_task_takes_a_backbone_or_its_arguments_not_both():
    backbone = DecoderBackbone(VOCAB, 16, **SMALL)
    with pytest.raises(ValueError, match=r"either a backbone or the arguments.*hidden_dim"):
        CausalLM(backbone, hidden_dim=8)
    with pytest.raises(
        ValueError, match=r"must be a DecoderBackbone\. Received: backbone=a EncoderBackbone"
    ):
        CausalLM(EncoderBackbone(VOCAB, 16, **SMALL))
    with pytest.raises(ValueError, match=r"needs a `backbone` \(a DecoderBackbone\)"):
        CausalLM()
    with pytest.raises(TypeError, match="`encoder_kwargs` is now called `backbone_kwargs`"):
        SequenceClassifier.from_pretrained("unused", num_classes=2, encoder_kwargs={})


@pytest.mark.slow
def test_backbones_save_and_load_in_a_fresh_process(tmp_path):
    import pickle

    cases = {}
    inputs = {"token_ids": TOKENS, "segment_ids": np.zeros_like(TOKENS)}
    for name, backbone, x in (
        ("decoder", DecoderBackbone(VOCAB, 16, **SMALL), TOKENS),
        ("encoder", EncoderBackbone(VOCAB, 16, **SMALL, dropout=0.0), inputs),
        ("seq2seq", Seq2SeqBackbone(VOCAB, 16, hidden_dim=16, num_heads=2, dropout=0.0),
         SEQ2SEQ_INPUTS),
    ):  # fmt: skip
        backbone.save(tmp_path / f"{name}.keras")
        out = keras.tree.map_structure(to_numpy, backbone(x, training=False))
        cases[name] = (x, out)
    with open(tmp_path / "cases.pkl", "wb") as f:
        pickle.dump(cases, f)
    diffs = run_in_fresh_process(_LOAD, tmp_path)
    assert set(diffs) == {"decoder", "encoder", "seq2seq"}
    assert max(diffs.values()) <= 1e-6, diffs


def test_configs_written_before_the_split_still_load():
    """`.keras` configs from before: class "Encoder", and a head's `encoder` entry."""
    keras.utils.set_random_seed(0)
    old_backbone = {
        "module": "keras_attn.models.encoder",
        "class_name": "Encoder",
        "registered_name": "keras_attn>Encoder",
        "config": EncoderBackbone(VOCAB, 16, **SMALL).get_config(),
    }
    backbone = keras.saving.deserialize_keras_object(old_backbone)
    assert isinstance(backbone, EncoderBackbone)
    head = SequenceClassifier.from_config(
        {"name": "old", "trainable": True, "encoder": old_backbone, "num_classes": 3,
         "pooling": "cls", "dropout": 0.1}
    )  # fmt: skip
    assert isinstance(head.backbone, EncoderBackbone) and head.output.shape == (None, 3)
    old_seq2seq = {
        "module": "keras_attn.models.seq2seq",
        "class_name": "Seq2Seq",
        "registered_name": "keras_attn>Seq2Seq",
        "config": {"name": "seq2seq", "trainable": True, "vocabulary_size": VOCAB,
                   "max_sequence_length": 16, "hidden_dim": 16, "num_heads": 2},
    }  # fmt: skip
    model = keras.saving.deserialize_keras_object(old_seq2seq)
    assert isinstance(model, Seq2SeqLM) and model.backbone.hidden_dim == 16


def _tokenizer():
    return WordPieceTokenizer([*SPECIAL_TOKENS, *WORDS])


def test_causal_lm_preprocessor_trains_on_raw_text_as_on_its_own_batch(tmp_path):
    tokenizer = _tokenizer()
    bos, eos = tokenizer.token_to_id("[BOS]"), tokenizer.token_to_id("[EOS]")
    preprocessor = CausalLMPreprocessor(tokenizer, StartEndPacker(9, bos, eos))
    x, y, weights = preprocessor.training_batch(["the cat sat"])
    the, cat, sat = (tokenizer.token_to_id(w) for w in ("the", "cat", "sat"))
    assert to_numpy(x["token_ids"]).tolist() == [[bos, the, cat, sat, eos, 0, 0, 0]]
    assert to_numpy(y).tolist() == [[the, cat, sat, eos, 0, 0, 0, 0]]
    assert to_numpy(weights).tolist() == [[1, 1, 1, 1, 0, 0, 0, 0]]
    keras.utils.set_random_seed(0)
    vocabulary = tokenizer.vocabulary_size()
    lm = CausalLM(vocabulary, 16, **SMALL, preprocessor=preprocessor)
    lm.compile(optimizer=keras.optimizers.Adam(1e-2), jit_compile=False)
    x, y, weights = preprocessor.training_batch(TEXT)
    by_hand = lm.evaluate(to_numpy(x["token_ids"]), to_numpy(y),
                          sample_weight=to_numpy(weights), verbose=0)  # fmt: skip
    assert lm.evaluate(TEXT, verbose=0) == pytest.approx(by_hand, rel=1e-6)
    history = lm.fit(TEXT, epochs=5, validation_data=TEXT[:2], verbose=0).history
    assert history["loss"][-1] < history["loss"][0] and len(history["val_loss"]) == 5
    assert isinstance(lm.generate("the cat", max_new_tokens=2), str)
    # Text in, text out; `stop_strings` cut the text before the first one (issue 27).
    full = lm.generate(["the cat", "a dog"], max_new_tokens=6)
    assert all(isinstance(t, str) for t in full) and full[0]
    stop = full[0].split()[min(1, len(full[0].split()) - 1)]
    cut = lm.generate(["the cat", "a dog"], max_new_tokens=6, stop_strings=[stop, "zzz"])
    assert cut[0] == full[0][: full[0].find(stop)]
    assert cut[1] == (full[1][: full[1].find(stop)] if stop in full[1] else full[1])
    with pytest.raises(ValueError, match="apply to text prompts"):
        lm.generate([[bos, the]], max_new_tokens=2, stop_strings=["x"])
    lm.save(tmp_path / "lm.keras")
    again = keras.saving.load_model(tmp_path / "lm.keras")
    assert isinstance(again.preprocessor, CausalLMPreprocessor)
    assert again.evaluate(TEXT, verbose=0) == pytest.approx(lm.evaluate(TEXT, verbose=0), 1e-6)
    with pytest.raises(ValueError, match=r"`packer` must be a StartEndPacker"):
        CausalLMPreprocessor(tokenizer, SegmentPacker(8, 2, 3))


def test_masked_lm_preprocessor_masks_only_real_tokens_and_trains(tmp_path):
    tokenizer = _tokenizer()
    cls_id, sep, mask_id = (tokenizer.token_to_id(t) for t in ("[CLS]", "[SEP]", "[MASK]"))
    packer = SegmentPacker(10, cls_id, sep)
    every = MaskedLMMaskGenerator(
        tokenizer.vocabulary_size(), mask_id, mask_selection_length=8, mask_selection_rate=1.0,
        mask_token_rate=1.0, random_token_rate=0.0, unselectable_token_ids=[0, cls_id, sep],
    )  # fmt: skip
    preprocessor = MaskedLMPreprocessor(tokenizer, packer, every)
    x, y, weights = preprocessor.training_batch(["the cat sat"])
    the, cat, sat = (tokenizer.token_to_id(w) for w in ("the", "cat", "sat"))
    assert to_numpy(x["token_ids"])[0, :6].tolist() == [cls_id, mask_id, mask_id, mask_id, sep, 0]
    assert to_numpy(x["mask_positions"])[0, :3].tolist() == [1, 2, 3]
    assert to_numpy(y)[0, :3].tolist() == [the, cat, sat]
    assert to_numpy(weights)[0].tolist() == [1, 1, 1, 0, 0, 0, 0, 0]
    keras.utils.set_random_seed(0)
    backbone = EncoderBackbone(tokenizer.vocabulary_size(), 10, **SMALL, num_segments=2)
    model = MaskedLM(backbone, preprocessor=preprocessor)
    model.compile(optimizer=keras.optimizers.Adam(1e-2), jit_compile=False)
    x, y, weights = preprocessor.training_batch(TEXT)  # every token masked: deterministic
    inputs = {name: to_numpy(x[name]) for name in model.input}
    by_hand = model.evaluate(inputs, to_numpy(y), sample_weight=to_numpy(weights), verbose=0)
    assert model.evaluate(TEXT, verbose=0) == pytest.approx(by_hand, rel=1e-6)
    history = model.fit(TEXT, epochs=5, verbose=0).history["loss"]
    assert history[-1] < history[0]
    model.save(tmp_path / "mlm.keras")
    again = keras.saving.load_model(tmp_path / "mlm.keras")
    assert again.preprocessor.masker.get_config() == every.get_config()
    assert again.evaluate(TEXT, verbose=0) == pytest.approx(model.evaluate(TEXT, verbose=0), 1e-6)
    with pytest.raises(ValueError, match=r"`masker` must be a MaskedLMMaskGenerator\. Received"):
        MaskedLMPreprocessor(tokenizer, packer, packer)
    with pytest.raises(ValueError, match=r"`packer` must be a SegmentPacker\. Received"):
        MaskedLMPreprocessor(tokenizer, StartEndPacker(8, 5, 6), every)
    partial = MaskedLMMaskGenerator(tokenizer.vocabulary_size(), mask_id, 4)  # only [PAD] kept
    with pytest.raises(ValueError, match=rf"Missing: \[{cls_id}, {sep}\]"):
        MaskedLMPreprocessor(tokenizer, packer, partial)


def test_layout_map_shards_each_familys_big_kernels_and_nothing_else():
    """`get_layout_map` (keras-hub's convention) names the projections of every family:
    encoder, Llama-layout decoder (gate, untied head, GQA) and encoder-decoder (cross
    attention); each layout has the variable's rank."""
    import re

    from keras_attn.models import Backbone

    # A mesh is names and shape here (no backend call), so this runs on every backend.
    mesh = keras.distribution.DeviceMesh((1, 1), ["batch", "model"], ["cpu:0"])
    layout = Backbone.get_layout_map(mesh)
    big = re.compile(r".*(token_embedding/embeddings|reverse_embeddings|attention/(query|key|"
                     r"value|attention_output)/kernel|feed_forward/(intermediate|gate|output)"
                     r"/kernel)")  # fmt: skip
    llama = dict(normalization="rms_norm", gated_feed_forward=True, activation="silu",
                 num_key_value_heads=1, tie_word_embeddings=False, position_encoding="rotary",
                 attention_bias=False, feed_forward_bias=False)  # fmt: skip
    families = [EncoderBackbone(VOCAB, 16, **SMALL), DecoderBackbone(VOCAB, 16, **SMALL, **llama),
                Seq2SeqBackbone(VOCAB, 16, hidden_dim=16, num_heads=2)]  # fmt: skip
    for backbone in families:
        sharded = []
        for variable in backbone.weights:
            axes = layout[variable.path]
            if axes is None:
                continue
            assert len(axes.axes) == len(variable.shape), variable.path
            if "model" in axes.axes:
                sharded.append(variable.path)
        assert sharded == [v.path for v in backbone.weights if big.fullmatch(v.path)]
        names = " ".join(sharded)
        for part in ("query", "key", "value", "attention_output", "intermediate", "output"):
            assert f"/{part}/kernel" in names, (backbone.name, part)
    assert "gate/kernel" in " ".join(v.path for v in families[1].weights if layout[v.path])
    assert "cross_attention" in " ".join(v.path for v in families[2].weights if layout[v.path])
    with pytest.raises(ValueError, match="`model_parallel_dim_name` must be an axis"):
        Backbone.get_layout_map(mesh, model_parallel_dim_name="tensor")
