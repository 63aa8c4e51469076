"""The heads encoder checkpoints carry: BERT's masked-LM and next-sentence heads and RoBERTa's
masked-LM head load into `MaskedLM` / `EncoderPretrainer`, and their logits equal the ones
`transformers` computes from the same folder."""

from pathlib import Path

import numpy as np
import pytest
from keras.ops import convert_to_numpy as to_numpy

from keras_attn.models import EncoderPretrainer, MaskedLM, SequenceClassifier

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SIZES = {
    "vocab_size": 60, "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
    "intermediate_size": 24, "max_position_embeddings": 40,
}  # fmt: skip
IDS = np.array([[2, 7, 9, 11, 3, 14, 15, 3], [2, 21, 22, 3, 30, 3, 0, 0]])
SEGMENTS = np.array([[0, 0, 0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 1, 1, 0, 0]])
POSITIONS = np.array([[1, 3, 6], [2, 4, 0]])


def _randomized(model):
    torch.manual_seed(0)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "bias" in name:  # transformers starts biases at zero: a copy would not show
                parameter.normal_(0.0, 0.5)
    return model.eval()


def _save(model, path):
    model.save_pretrained(path)
    return path


def _inputs(mask, segments=True):
    inputs = {"token_ids": IDS, "mask_positions": POSITIONS}
    if segments:
        inputs["segment_ids"] = SEGMENTS
    if mask:
        inputs["padding_mask"] = (IDS != 0).astype("int32")
    return inputs


def _at_positions(logits):
    return np.take_along_axis(logits, POSITIONS[..., None], axis=1)


def test_bert_pretraining_heads_equal_transformers(tmp_path):
    torch.manual_seed(0)
    reference = _randomized(transformers.BertForPreTraining(transformers.BertConfig(**SIZES)))
    folder = _save(reference, tmp_path / "bert")
    with torch.no_grad():
        out = reference(
            input_ids=torch.tensor(IDS), token_type_ids=torch.tensor(SEGMENTS),
            attention_mask=torch.tensor(IDS != 0),
        )  # fmt: skip
    expected_mlm = _at_positions(out.prediction_logits.numpy())
    pretrainer = EncoderPretrainer.from_pretrained(folder, preprocessor=None)
    ours = pretrainer(_inputs(mask=False), training=False)
    np.testing.assert_allclose(to_numpy(ours["mlm"]), expected_mlm, atol=1e-5)
    np.testing.assert_allclose(
        to_numpy(ours["nsp"]), out.seq_relationship_logits.numpy(), atol=1e-5
    )
    masked = MaskedLM.from_pretrained(folder, preprocessor=None, strict=False)
    np.testing.assert_allclose(
        to_numpy(masked(_inputs(mask=False), training=False)), expected_mlm, atol=1e-5
    )
    with pytest.raises(ValueError, match=r"cls\.seq_relationship"):
        MaskedLM.from_pretrained(folder, preprocessor=None)  # the NSP head would go unused
    with pytest.raises(ValueError, match=r"cls\.predictions"):
        SequenceClassifier.from_pretrained(folder, num_classes=2, preprocessor=None)


# BERT's head transform applies `hidden_act`; RoBERTa's applies exact GELU whatever it says.
@pytest.mark.parametrize("hidden_act", ["gelu", "relu", "gelu_new"])
def test_bert_masked_lm_equals_transformers(tmp_path, hidden_act):
    torch.manual_seed(1)
    config = transformers.BertConfig(**SIZES, hidden_act=hidden_act)
    reference = _randomized(transformers.BertForMaskedLM(config))
    folder = _save(reference, tmp_path / "bert_mlm")
    with torch.no_grad():
        logits = reference(
            input_ids=torch.tensor(IDS), token_type_ids=torch.tensor(SEGMENTS),
            attention_mask=torch.tensor(IDS != 0),
        ).logits.numpy()  # fmt: skip
    masked = MaskedLM.from_pretrained(folder, preprocessor=None)
    ours = to_numpy(masked(_inputs(mask=False), training=False))
    np.testing.assert_allclose(ours, _at_positions(logits), atol=1e-5)
    assert np.abs(_at_positions(logits)).max() > 0.5


@pytest.mark.parametrize("hidden_act", ["gelu", "relu", "gelu_new"])
def test_roberta_masked_lm_equals_transformers(tmp_path, hidden_act):
    torch.manual_seed(2)
    config = transformers.RobertaConfig(
        **{**SIZES, "max_position_embeddings": 44}, hidden_act=hidden_act
    )
    reference = _randomized(transformers.RobertaForMaskedLM(config))
    folder = _save(reference, tmp_path / "roberta")
    ids = np.where(IDS == 0, 1, IDS)  # RoBERTa pads with 1
    with torch.no_grad():
        logits = reference(
            input_ids=torch.tensor(ids), attention_mask=torch.tensor(ids != 1)
        ).logits.numpy()
    masked = MaskedLM.from_pretrained(folder, preprocessor=None)
    inputs = {"token_ids": ids, "mask_positions": POSITIONS}
    if "segment_ids" in masked.input:
        inputs["segment_ids"] = np.zeros_like(ids)
    ours = to_numpy(masked(inputs, training=False))
    np.testing.assert_allclose(ours, _at_positions(logits), atol=1e-5)
    assert masked.get_config()["activation"] == "gelu"


def test_a_bare_encoder_folder_leaves_the_head_fresh(tmp_path):
    torch.manual_seed(3)
    folder = _save(transformers.BertModel(transformers.BertConfig(**SIZES)), tmp_path / "bare")
    masked = MaskedLM.from_pretrained(folder, preprocessor=None)
    bias = next(w for w in masked.weights if w.path == "mlm_output_bias/bias")
    assert not to_numpy(bias).any()


@pytest.mark.tf_only  # the preprocessor's tokenizer runs in TensorFlow
def test_fill_mask_equals_transformers_on_the_minilm_vocabulary(tmp_path):
    """A `BertForMaskedLM` written by transformers on the packaged MiniLM's vocabulary: the
    top tokens and probabilities of each [MASK] equal its own."""
    import shutil

    from keras_attn.data import checkpoint_folder

    torch.manual_seed(4)
    config = transformers.BertConfig(**{**SIZES, "vocab_size": 30522})
    reference = _randomized(transformers.BertForMaskedLM(config))
    folder = _save(reference, tmp_path / "bert")
    shutil.copy(Path(checkpoint_folder()) / "vocab.txt", folder / "vocab.txt")
    tokenizer = transformers.BertTokenizer(str(folder / "vocab.txt"))
    masked = MaskedLM.from_pretrained(folder, sequence_length=24)
    texts = ["the [MASK] sat on the mat.", "to be or [MASK] to [MASK], that is the question"]
    ours = masked.fill_mask(texts, top_k=3)
    for text, answer in zip(texts, ours, strict=True):
        ids = tokenizer(text, return_tensors="pt").input_ids
        with torch.no_grad():
            probabilities = reference(input_ids=ids).logits.softmax(-1)[0]
        where = (ids[0] == tokenizer.mask_token_id).nonzero().flatten().tolist()
        assert len(answer) == len(where) >= 1
        for predicted, position in zip(answer, where, strict=True):
            top = probabilities[position].topk(3)
            expected = tokenizer.convert_ids_to_tokens(top.indices.tolist())
            assert [token for token, _ in predicted] == expected
            np.testing.assert_allclose([p for _, p in predicted], top.values.numpy(), atol=1e-5)
    with pytest.raises(ValueError, match=r"needs a \[MASK\]"):
        masked.fill_mask("no mask here")
