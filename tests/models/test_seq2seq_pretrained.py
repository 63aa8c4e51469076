"""BART, Marian and T5 (v1.0, v1.1) folders written by `transformers` load into
`Seq2SeqBackbone`: logits equal `transformers`' float64 forward, greedy ids equal its
`generate`, and `save_pretrained` writes the same tensors back."""

import json

import numpy as np
import pytest
from keras.ops import convert_to_numpy as to_numpy
from safetensors.numpy import load_file

from keras_attn.layers import RelativePositionBias
from keras_attn.models import Seq2SeqBackbone, Seq2SeqLM
from keras_attn.pretrained import load_pretrained, save_pretrained
from keras_attn.pretrained.folder import GENERATION_KEYS

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


def _t5_v1_1():  # gated GELU, heads narrower than d_model / num_heads, its own head
    config = transformers.T5Config(
        **T5_SIZES, d_kv=6, feed_forward_proj="gated-gelu", tie_word_embeddings=False
    )
    return transformers.T5ForConditionalGeneration(config)


def _untie(model, folder):
    """transformers 5 writes T5 v1.1's head tied; a real v1.1 folder stores its own
    `lm_head.weight`, which it then loads untied. Written here, and read back as it would be."""
    from safetensors.torch import load_file, save_file

    weights = load_file(folder / "model.safetensors")
    weights["lm_head.weight"] = torch.randn_like(weights["shared.weight"]) * 0.3
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    return type(model).from_pretrained(folder).eval()


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
    if request.param == "t5_v1_1":
        model = _untie(model, folder)
        assert not torch.equal(model.lm_head.weight, model.shared.weight)
    return request.param, model, folder, Seq2SeqLM(load_pretrained(folder, dropout=0.0))


def _batch(pad, start):
    source = np.array([[5, 6, 7, 8, 9, 10, 11, 3], [12, 13, 14, 3, pad, pad, pad, pad]])
    target = np.array([[start, 20, 21, 22, 23, 24], [start, 30, 31, 32, 33, 34]])
    return source, target


def test_logits_equal_transformers_float64(family):
    name, model, _, lm = family
    pad, start = lm.pad_token_id, lm.decoder_start_token_id
    source, target = _batch(pad, start)
    ours = to_numpy(lm({"encoder_token_ids": source, "decoder_token_ids": target}))

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
    name, model, _, lm = family
    pad, start, end = lm.pad_token_id, lm.decoder_start_token_id, model.config.eos_token_id
    source, _ = _batch(pad, start)
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
    # BART's and Marian's checkpoints force their end id on the last step: a row that ran
    # to the limit ends one id early, as transformers' does.
    forced = model.generation_config.forced_eos_token_id
    assert forced == lm.forced_eos_token_id == (None if name.startswith("t5") else end)
    free = lm.generate(sources, 10, start, stop_token_ids=[end], pad_token_id=None,
                       forced_eos_token_id=None)  # fmt: skip
    if forced is not None:
        assert any(len(f) == 10 and o == f[:9] for o, f in zip(ours, free, strict=True)), name


def _reference_ids(model, source, pad, end, **settings):
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
    name, model, _, lm = family
    pad, start, end = lm.pad_token_id, lm.decoder_start_token_id, model.config.eos_token_id
    source, _ = _batch(pad, start)
    expected = _reference_ids(model, source, pad, end, max_new_tokens=9, **settings)
    sources = [[int(t) for t in row if t != pad] for row in source]
    ours = lm.generate(sources, 9, start, sampler="beam", stop_token_ids=[end],
                       pad_token_id=None, **settings)  # fmt: skip
    assert ours == expected, (name, settings)


def test_no_repeat_ngram_greedy_equals_transformers(family):
    name, model, _, lm = family
    pad, start, end = lm.pad_token_id, lm.decoder_start_token_id, model.config.eos_token_id
    source, _ = _batch(pad, start)
    expected = _reference_ids(model, source, pad, end, max_new_tokens=9, no_repeat_ngram_size=2)
    sources = [[int(t) for t in row if t != pad] for row in source]
    ours = lm.generate(sources, 9, start, stop_token_ids=[end], pad_token_id=None,
                       no_repeat_ngram_size=2)  # fmt: skip
    assert ours == expected, name


def test_save_pretrained_writes_the_same_tensors_and_transformers_reads_them(family, tmp_path):
    name, model, folder, _ = family
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
        assert np.array_equal(to_numpy(a), to_numpy(b)), a.path


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize(("buckets", "distance"), [(32, 128), (8, 20), (64, 256), (16, 100)])
def test_relative_position_buckets_equal_t5(buckets, distance, bidirectional):
    from transformers.models.t5.modeling_t5 import T5Attention

    relative = torch.arange(700)[None, :] - torch.arange(300)[:, None]
    expected = T5Attention._relative_position_bucket(
        relative, bidirectional=bidirectional, num_buckets=buckets, max_distance=distance
    ).numpy()
    layer = RelativePositionBias(2, buckets, distance, bidirectional)
    assert np.array_equal(to_numpy(layer.buckets(300, 700)), expected)


def test_relative_position_bias_of_a_decoding_step_is_a_slice_of_the_full_one():
    layer = RelativePositionBias(3, 8, 20, bidirectional=False)
    x = np.zeros((1, 9, 4), "float32")
    full = to_numpy(layer(x))
    step = to_numpy(layer(x[:, :2], key_length=9, start_index=4))
    np.testing.assert_array_equal(step, full[:, :, 4:6, :])


def _edited(tmp_path, family, **changes):
    """A folder of `family` written by transformers, its config.json then edited."""
    torch.manual_seed(0)
    FAMILIES[family]().save_pretrained(tmp_path)
    for name in ("config.json", "generation_config.json"):  # the latter's keys win
        config = json.loads((tmp_path / name).read_text())
        edits = {k: v for k, v in changes.items()
                 if name == "config.json" or k in config or k in GENERATION_KEYS}  # fmt: skip
        (tmp_path / name).write_text(json.dumps({**config, **edits}))
    return tmp_path


@pytest.mark.parametrize(
    "edit",
    ["as_written", "generation_config_silent", "no_generation_config", "both_silent",
     "generation_config_says_other"],
)  # fmt: skip
def test_forced_eos_is_read_where_transformers_reads_it(tmp_path, edit):
    """`generation_config.json`, where there is one (a key it lacks is None, whatever
    config.json says), else config.json: what `transformers` 5 loads, in every case."""
    torch.manual_seed(0)
    _bart().save_pretrained(tmp_path)
    config, generation = (tmp_path / "config.json"), (tmp_path / "generation_config.json")
    if edit in ("generation_config_silent", "both_silent"):
        written = json.loads(generation.read_text())
        generation.write_text(json.dumps({k: v for k, v in written.items()
                                          if k != "forced_eos_token_id"}))  # fmt: skip
    if edit in ("no_generation_config", "both_silent"):
        generation.unlink() if edit == "no_generation_config" else None
        written = json.loads(config.read_text())
        if edit == "both_silent":
            written.pop("forced_eos_token_id")
        config.write_text(json.dumps(written))
    if edit == "generation_config_says_other":
        generation.write_text(json.dumps({**json.loads(generation.read_text()),
                                          "forced_eos_token_id": 5}))  # fmt: skip
    expected = transformers.BartForConditionalGeneration.from_pretrained(tmp_path)
    expected = expected.generation_config.forced_eos_token_id
    want = {"as_written": 2, "generation_config_silent": None, "no_generation_config": 2,
            "both_silent": None, "generation_config_says_other": 5}[edit]  # fmt: skip
    assert expected == want  # transformers' own reading, pinned
    assert load_pretrained(tmp_path).forced_eos_token_id == want


@pytest.mark.parametrize(
    ("family", "changes", "match"),
    [
        ("bart", {"decoder_ffn_dim": 40}, "encoder_ffn_dim=37, decoder_ffn_dim=40"),
        ("bart", {"pad_token_id": 500}, r"pad_token_id must be an id of its vocabulary"),
        ("bart", {"decoder_start_token_id": -1}, "decoder_start_token_id"),
        ("bart", {"forced_eos_token_id": 99}, "forced_eos_token_id must be an id of its voc"),
        ("bart", {"forced_eos_token_id": [2, 3]}, "forced_eos_token_id"),
        ("bart", {"forced_bos_token_id": 99}, "forced_bos_token_id must be an id of its voc"),
        ("bart", {"forced_bos_token_id": "0"}, "forced_bos_token_id"),
        ("bart", {"is_encoder_decoder": False}, "is_encoder_decoder"),
        # Sizes the tensors disagree with are named before the model is built.
        ("bart", {"max_position_embeddings": 1 << 20}, r"embed_positions\.weight"),
        ("bart", {"decoder_layers": 40}, r"decoder\.layers\.39"),
        ("t5_v1_0", {"feed_forward_proj": "gated-bogus"}, "feed_forward_proj"),
        ("t5_v1_0", {"dense_act_fn": "gelu"}, "dense_act_fn disagrees"),
        ("t5_v1_0", {"num_heads": 0}, "num_heads"),
        ("t5_v1_0", {"d_model": 0}, "hidden_dim"),
        ("t5_v1_0", {"relative_attention_max_distance": 10**15}, "relative_attention_max"),
        ("t5_v1_0", {"d_ff": 1 << 20}, r"DenseReluDense\.wi\.weight"),
        ("t5_v1_0", {"num_decoder_layers": 1000}, r"decoder\.block\.999"),
        ("marian", {"decoder_vocab_size": 7}, "separate decoder vocabulary"),
        ("marian", {"bad_words_ids": "98"}, r"bad_words_ids must be \[\] or"),
        ("marian", {"bad_words_ids": [[98], [5]]}, "other banned words are not supported"),
    ],
)
def test_unsupported_or_hostile_configs_are_refused_by_name(tmp_path, family, changes, match):
    folder = _edited(tmp_path, family, **changes)
    with pytest.raises(ValueError, match=match):
        load_pretrained(folder)


def test_bad_arguments_are_refused_naming_them():
    from keras_attn.decoding import decode
    from keras_attn.layers import SinusoidalPositionEncoding
    from keras_attn.models.pretraining import LogitBias

    with pytest.raises(ValueError, match="max_distance"):
        RelativePositionBias(2, 32, 1 << 20)
    with pytest.raises(ValueError, match="max_distance"):
        RelativePositionBias(2, 32, 8)  # no larger than its exact buckets
    with pytest.raises(ValueError, match="layout"):
        SinusoidalPositionEncoding(layout="diagonal")
    with pytest.raises(ValueError, match="logit_scale"):
        Seq2SeqBackbone(10, 8, logit_scale=0.0)
    with pytest.raises(ValueError, match="units"):
        LogitBias(0)
    lm = Seq2SeqLM(Seq2SeqBackbone(10, 8, hidden_dim=8, num_heads=2, num_encoder_layers=1,
                                   num_decoder_layers=1, decoder_start_token_id=1))  # fmt: skip
    with pytest.raises(ValueError, match="early_stopping"):
        lm.generate([[3, 4]], 2, sampler="beam", early_stopping="sometimes")
    with pytest.raises(ValueError, match="no_repeat_ngram_size"):
        decode(lm.runner([[3, 4]]), [[1]], 2, no_repeat_ngram_size=-1)
    with pytest.raises(TypeError, match="'sources'"):  # the argument's name since 43
        lm.generate(source_ids=[[3]], max_new_tokens=2)
    with pytest.raises(ValueError, match="position_encoding"):
        Seq2SeqBackbone(10, 8, position_encoding="rotary")


def test_marian_padding_ban_from_generation_config(tmp_path):
    """opus-mt folders ban the padding id (`bad_words_ids=[[pad]]`, in generation_config.json
    since transformers 5): with a bias that makes padding the likeliest id, greedy ids still
    equal `transformers.generate`, the flag survives `save_pretrained`, and export records
    the id as never generated."""
    from keras_attn_export.seq2seq import _entry

    torch.manual_seed(0)
    model = _marian().eval()
    with torch.no_grad():
        model.final_logits_bias[0, 98] += 50.0
    model.generation_config.bad_words_ids = [[98]]
    model.save_pretrained(tmp_path / "hf")
    lm = Seq2SeqLM.from_pretrained(tmp_path / "hf", dropout=0.0)
    assert lm.suppress_padding and lm.never_generated_id == 98
    source, _ = _batch(98, 98)
    expected = _reference_ids(model, source, 98, 0, max_new_tokens=6, num_beams=1)
    sources = [[int(t) for t in row if t != 98] for row in source]
    ours = lm.generate(sources, 6, stop_token_ids=[0])
    assert ours == expected and not any(98 in row for row in ours)
    unbanned = lm.generate(sources, 6, stop_token_ids=[0], pad_token_id=None)
    assert unbanned != ours  # the ban is what keeps padding out
    lm.save_pretrained(tmp_path / "ours")
    assert Seq2SeqLM.from_pretrained(tmp_path / "ours").suppress_padding
    reread = transformers.MarianMTModel.from_pretrained(tmp_path / "ours")
    assert reread.generation_config.bad_words_ids == [[98]]
    assert _entry(lm, {"max_length": 64})["never_generated_id"] == 98


def test_forced_bos_equals_transformers_generate(tmp_path):
    """`bart-large-cnn`'s folders force the first new id (`forced_bos_token_id`, in
    generation_config.json since transformers 5): greedy, beam and n-gram ids
    equal `transformers.generate`, every row starts with it, it survives `save_pretrained`,
    and the export records it."""
    from keras_attn_export.seq2seq import _entry

    torch.manual_seed(0)
    model = _bart().eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(SCALES["bart"])
        model.final_logits_bias[0, 2] -= 3.0
    model.generation_config.forced_bos_token_id = 7
    model.save_pretrained(tmp_path / "hf")
    lm = Seq2SeqLM.from_pretrained(tmp_path / "hf", dropout=0.0)
    assert lm.forced_bos_token_id == 7 and lm.forced_eos_token_id == 2
    source, _ = _batch(1, 2)
    sources = [[int(t) for t in row if t != 1] for row in source]
    for settings in ({"num_beams": 1}, {"num_beams": 3, "length_penalty": 1.0},
                     {"num_beams": 2, "no_repeat_ngram_size": 2}):  # fmt: skip
        expected = _reference_ids(model, source, 1, 2, max_new_tokens=7, **settings)
        beam = {"sampler": "beam", **settings} if settings["num_beams"] > 1 else {}
        ours = lm.generate(sources, 7, stop_token_ids=[2], pad_token_id=None, **beam)
        assert ours == expected, settings
        assert all(row[0] == 7 for row in ours), settings
    free = lm.generate(sources, 7, stop_token_ids=[2], pad_token_id=None, forced_bos_token_id=None)
    assert all(row[0] != 7 for row in free)  # the forcing is what puts 7 first
    # One new id: the end id is forced too, and wins (transformers applies it second).
    assert lm.generate(sources, 1, stop_token_ids=[], pad_token_id=None) == [[2], [2]]
    lm.save_pretrained(tmp_path / "ours")
    assert Seq2SeqLM.from_pretrained(tmp_path / "ours").forced_bos_token_id == 7
    reread = transformers.BartForConditionalGeneration.from_pretrained(tmp_path / "ours")
    assert reread.generation_config.forced_bos_token_id == 7
    assert _entry(lm, {"max_length": 64})["forced_bos_token_id"] == 7
    unforced = type(lm.backbone).from_config({**lm.backbone.get_config(),
                                              "forced_bos_token_id": None})  # fmt: skip
    assert _entry(Seq2SeqLM(unforced), {"max_length": 64})["forced_bos_token_id"] is None


@pytest.mark.parametrize(
    ("edit", "generation_file", "want"),
    [
        ({"force_bos_token_to_be_generated": True}, False, 0),
        ({"force_bos_token_to_be_generated": True, "forced_bos_token_id": 5}, False, 0),
        ({"force_bos_token_to_be_generated": True, "bos_token_id": 7}, False, 7),
        ({"force_bos_token_to_be_generated": False, "forced_bos_token_id": 5}, False, 5),
        ({"force_bos_token_to_be_generated": True}, True, None),
        ({"forced_bos_token_id": 5}, True, None),
    ],
)
def test_forced_bos_is_read_where_transformers_reads_it(tmp_path, edit, generation_file, want):
    """Older BART folders say `force_bos_token_to_be_generated`: without a
    generation_config.json, `transformers` forces the config's `bos_token_id` then, whatever
    `forced_bos_token_id` says; with one, it reads only that file."""
    torch.manual_seed(0)
    _bart().save_pretrained(tmp_path)
    if not generation_file:
        (tmp_path / "generation_config.json").unlink()
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, **edit}))
    model = transformers.BartForConditionalGeneration.from_pretrained(tmp_path)
    assert model.generation_config.forced_bos_token_id == want  # transformers' reading, pinned
    assert load_pretrained(tmp_path).forced_bos_token_id == want
