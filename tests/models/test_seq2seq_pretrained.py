"""BART, Marian and T5 (v1.0, v1.1) folders written by `transformers` load into
`Seq2SeqBackbone`: logits equal `transformers`' float64 forward, greedy ids equal its
`generate`, and `save_pretrained` writes the same tensors back."""

import json

import numpy as np
import pytest
from safetensors.numpy import load_file

from keras_attn.layers import RelativePositionBias
from keras_attn.models import Seq2SeqBackbone, Seq2SeqLM
from keras_attn.pretrained import load_pretrained, save_pretrained

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SIZES = {"vocab_size": 99, "d_model": 32}
BART_SIZES = {
    **SIZES, "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4,
    "decoder_attention_heads": 4, "encoder_ffn_dim": 37, "decoder_ffn_dim": 37,
    "max_position_embeddings": 64,
}  # fmt: skip
T5_SIZES = {
    **SIZES, "d_ff": 37, "num_layers": 2, "num_heads": 4, "decoder_start_token_id": 0,
    "relative_attention_num_buckets": 8, "relative_attention_max_distance": 20,
}  # fmt: skip


def _bart():
    model = transformers.BartForConditionalGeneration(transformers.BartConfig(**BART_SIZES))
    torch.nn.init.normal_(model.final_logits_bias, std=0.1)
    return model


def _marian():
    config = transformers.MarianConfig(
        **BART_SIZES, pad_token_id=98, decoder_start_token_id=98, eos_token_id=0,
        scale_embedding=True,
    )  # fmt: skip
    model = transformers.MarianMTModel(config)
    torch.nn.init.normal_(model.final_logits_bias, std=0.1)
    return model


def _t5_v1_0():
    config = transformers.T5Config(**T5_SIZES, d_kv=8, feed_forward_proj="relu")
    return transformers.T5ForConditionalGeneration(config)


def _t5_v1_1():  # gated GELU, an untied head, heads narrower than d_model / num_heads
    config = transformers.T5Config(
        **T5_SIZES, d_kv=6, feed_forward_proj="gated-gelu", tie_word_embeddings=False
    )
    return transformers.T5ForConditionalGeneration(config)


FAMILIES = {"bart": _bart, "marian": _marian, "t5_v1_0": _t5_v1_0, "t5_v1_1": _t5_v1_1}
# Weights scaled up from the families' small initial ones, so that greedy decoding of the
# random model neither repeats one id nor ends at once.
SCALES = {"bart": 4.0, "marian": 2.0, "t5_v1_0": 1.0, "t5_v1_1": 2.0}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory):
    torch.manual_seed(0)
    model = FAMILIES[request.param]()
    with torch.no_grad():
        for key, parameter in model.named_parameters():
            if "embed_positions" not in key or request.param == "bart":  # Marian's are fixed
                parameter.mul_(SCALES[request.param])
        if request.param == "bart":
            model.final_logits_bias[0, model.config.eos_token_id] -= 3.0
    model.eval()
    folder = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(folder)
    return request.param, model, folder


def _batch(pad, start):
    source = np.array([[5, 6, 7, 8, 9, 10, 11, 3], [12, 13, 14, 3, pad, pad, pad, pad]])
    target = np.array([[start, 20, 21, 22, 23, 24], [start, 30, 31, 32, 33, 34]])
    return source, target


def test_logits_equal_transformers_float64(family):
    name, model, folder = family
    lm = Seq2SeqLM(load_pretrained(folder, dropout=0.0))
    pad, start = lm.pad_token_id, lm.decoder_start_token_id
    source, target = _batch(pad, start)
    ours = np.asarray(lm({"encoder_token_ids": source, "decoder_token_ids": target}))

    def forward():
        with torch.no_grad():
            return model(
                input_ids=torch.tensor(source), attention_mask=torch.tensor(source != pad),
                decoder_input_ids=torch.tensor(target),
            ).logits.numpy().astype("float64")  # fmt: skip

    own_float32 = forward()
    reference = model.double() and forward()
    model.float()
    # 1e-4, or transformers' own float32 error where these random weights make it larger.
    tolerance = max(1e-4, 2 * np.abs(own_float32 - reference).max())
    assert np.abs(ours - reference).max() <= tolerance, name
    assert tolerance <= 2e-3, (name, tolerance)
    assert np.abs(reference).max() > 1.0  # logits that could show a difference


def test_greedy_ids_equal_transformers_generate(family):
    name, model, folder = family
    lm = Seq2SeqLM(load_pretrained(folder, dropout=0.0))
    pad, start, end = lm.pad_token_id, lm.decoder_start_token_id, model.config.eos_token_id
    source, _ = _batch(pad, start)
    model.generation_config.forced_eos_token_id = None  # BART's and Marian's last-step rule
    with torch.no_grad():
        reference = model.generate(
            input_ids=torch.tensor(source), attention_mask=torch.tensor(source != pad),
            max_new_tokens=10, do_sample=False, num_beams=1,
        ).numpy()  # fmt: skip
    expected = []
    for row in reference.tolist():
        ids = row[1:]
        expected.append(ids[: ids.index(end)] if end in ids else ids)
    sources = [[int(t) for t in row if t != pad] for row in source]
    ours = lm.generate(sources, 10, start, stop_token_ids=[end], pad_token_id=None)
    assert ours == expected, name
    assert any(ours)  # something was generated before the end id
    uncached = lm.generate(sources, 10, start, stop_token_ids=[end], pad_token_id=None,
                           use_cache=False)  # fmt: skip
    assert uncached == ours


def _reference_ids(model, source, pad, end, **settings):
    model.generation_config.forced_eos_token_id = None
    with torch.no_grad():
        rows = model.generate(
            input_ids=torch.tensor(source), attention_mask=torch.tensor(source != pad),
            do_sample=False, **settings,
        ).tolist()  # fmt: skip
    return [row[1 : row.index(end, 1)] if end in row[1:] else row[1:] for row in rows]


BEAM_SETTINGS = [
    {"num_beams": 3, "length_penalty": 1.0, "early_stopping": False},
    {"num_beams": 4, "length_penalty": 2.0, "early_stopping": True},
    {"num_beams": 3, "length_penalty": 0.5, "early_stopping": "never"},
    {"num_beams": 2, "length_penalty": 1.0, "no_repeat_ngram_size": 2},
]


@pytest.mark.parametrize("settings", BEAM_SETTINGS, ids=lambda s: "-".join(map(str, s.values())))
def test_beam_ids_equal_transformers_generate(family, settings):
    name, model, folder = family
    lm = Seq2SeqLM(load_pretrained(folder, dropout=0.0))
    pad, start, end = lm.pad_token_id, lm.decoder_start_token_id, model.config.eos_token_id
    source, _ = _batch(pad, start)
    expected = _reference_ids(model, source, pad, end, max_new_tokens=9, **settings)
    sources = [[int(t) for t in row if t != pad] for row in source]
    ours = lm.generate(sources, 9, start, sampler="beam", stop_token_ids=[end],
                       pad_token_id=None, **settings)  # fmt: skip
    assert ours == expected, (name, settings)


def test_no_repeat_ngram_greedy_equals_transformers(family):
    name, model, folder = family
    lm = Seq2SeqLM(load_pretrained(folder, dropout=0.0))
    pad, start, end = lm.pad_token_id, lm.decoder_start_token_id, model.config.eos_token_id
    source, _ = _batch(pad, start)
    expected = _reference_ids(model, source, pad, end, max_new_tokens=9, no_repeat_ngram_size=2)
    sources = [[int(t) for t in row if t != pad] for row in source]
    ours = lm.generate(sources, 9, start, stop_token_ids=[end], pad_token_id=None,
                       no_repeat_ngram_size=2)  # fmt: skip
    assert ours == expected, name


def test_save_pretrained_writes_the_same_tensors_and_transformers_reads_them(family, tmp_path):
    name, model, folder = family
    backbone = load_pretrained(folder)
    save_pretrained(backbone, tmp_path / "out")
    original = load_file(folder / "model.safetensors")
    written = load_file(tmp_path / "out" / "model.safetensors")
    assert sorted(written) == sorted(original), name
    for key, value in original.items():
        assert np.array_equal(written[key], value), key
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    reread = type(model).from_pretrained(tmp_path / "out").eval()
    for key, value in model.state_dict().items():
        assert torch.equal(reread.state_dict()[key], value), key
    assert load_pretrained(tmp_path / "out").get_config() == backbone.get_config()
    save_pretrained(backbone, tmp_path / "shards", max_shard_size=20_000)
    assert len(list((tmp_path / "shards").glob("model-*.safetensors"))) > 1
    assert config["model_type"] == name.split("_")[0]
    for a, b in zip(load_pretrained(tmp_path / "shards").weights, backbone.weights, strict=True):
        assert np.array_equal(np.asarray(a), np.asarray(b)), a.path


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize(("buckets", "distance"), [(32, 128), (8, 20), (64, 256), (16, 100)])
def test_relative_position_buckets_equal_t5(buckets, distance, bidirectional):
    from transformers.models.t5.modeling_t5 import T5Attention

    relative = torch.arange(700)[None, :] - torch.arange(300)[:, None]
    expected = T5Attention._relative_position_bucket(
        relative, bidirectional=bidirectional, num_buckets=buckets, max_distance=distance
    ).numpy()
    layer = RelativePositionBias(2, buckets, distance, bidirectional)
    assert np.array_equal(np.asarray(layer.buckets(300, 700)), expected)


def test_relative_position_bias_of_a_decoding_step_is_a_slice_of_the_full_one():
    layer = RelativePositionBias(3, 8, 20, bidirectional=False)
    x = np.zeros((1, 9, 4), "float32")
    full = np.asarray(layer(x))
    step = np.asarray(layer(x[:, :2], key_length=9, start_index=4))
    np.testing.assert_array_equal(step, full[:, :, 4:6, :])


def test_unsupported_configs_are_refused_naming_the_key(tmp_path):
    model = transformers.BartForConditionalGeneration(
        transformers.BartConfig(**{**BART_SIZES, "decoder_ffn_dim": 40})
    )
    model.save_pretrained(tmp_path / "bart")
    with pytest.raises(ValueError, match="encoder_ffn_dim=37, decoder_ffn_dim=40"):
        load_pretrained(tmp_path / "bart")
    config = transformers.T5Config(**T5_SIZES, feed_forward_proj="gated-bogus")
    config.save_pretrained(tmp_path / "t5")
    (tmp_path / "t5" / "model.safetensors").write_bytes(
        (tmp_path / "bart" / "model.safetensors").read_bytes()
    )
    with pytest.raises(ValueError, match="feed_forward_proj"):
        load_pretrained(tmp_path / "t5")
    with pytest.raises(ValueError, match="position_encoding"):
        Seq2SeqBackbone(10, 8, position_encoding="rotary")
