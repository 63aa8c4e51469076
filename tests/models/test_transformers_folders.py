"""Folders written by `transformers` itself (the pinned 5.x), loaded by `from_pretrained` and
compared with what `transformers` computes; our `save_pretrained` read back by `transformers`;
and config.json keys, sizes, dtypes and files that must be refused before anything is built."""

import json
import struct

import numpy as np
import pytest

from keras_attn.models import CausalLM
from keras_attn.pretrained import load_pretrained, save_pretrained
from tests.helpers import to_numpy

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SIZES = {"vocab_size": 96, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4}
LLAMA = {**SIZES, "intermediate_size": 48, "num_key_value_heads": 2, "max_position_embeddings": 64}
LLAMA3 = {
    "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
    "high_freq_factor": 4.0, "original_max_position_embeddings": 16,
}  # fmt: skip
DECODERS = {
    "llama_llama3": ("LlamaConfig", "LlamaForCausalLM", {**LLAMA, "rope_parameters": LLAMA3}),
    "llama_linear_bias": (
        "LlamaConfig", "LlamaForCausalLM",
        {**LLAMA, "attention_bias": True, "mlp_bias": True, "head_dim": 16,
         "rope_parameters": {"rope_type": "linear", "rope_theta": 5000.0, "factor": 2.0}},
    ),
    "qwen2_theta": ("Qwen2Config", "Qwen2ForCausalLM", {**LLAMA, "rope_theta": 1e6}),
    "qwen2_tied": (
        "Qwen2Config", "Qwen2ForCausalLM", {**LLAMA, "tie_word_embeddings": True},
    ),
    "mistral": ("MistralConfig", "MistralForCausalLM", {**LLAMA, "sliding_window": 32}),
    "gpt2": (
        "GPT2Config", "GPT2LMHeadModel",
        {"vocab_size": 96, "n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 64},
    ),
}  # fmt: skip
ENCODERS = {
    "bert": ("BertConfig", "BertModel", {**SIZES, "intermediate_size": 48}),
    "roberta": (
        "RobertaConfig", "RobertaModel",
        {**SIZES, "intermediate_size": 48, "max_position_embeddings": 66},
    ),
    "distilbert": (
        "DistilBertConfig", "DistilBertModel",
        {"vocab_size": 96, "dim": 32, "n_layers": 2, "n_heads": 4, "hidden_dim": 48},
    ),
}  # fmt: skip
TOKENS = np.random.default_rng(0).integers(3, 96, size=(2, 12)).astype("int32")


def _write(folder, case, cases):
    config_class, model_class, kwargs = cases[case]
    torch.manual_seed(len(case))
    config = getattr(transformers, config_class)(**kwargs)
    model = getattr(transformers, model_class)(config).eval()
    with torch.no_grad():  # nonzero biases and norms, so a misplaced one shows
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    model.save_pretrained(folder)
    return model


def _reference(model, token_ids):
    with torch.no_grad():
        out = model(torch.from_numpy(token_ids.astype("int64")))
    return (out.logits if hasattr(out, "logits") else out.last_hidden_state).numpy()


@pytest.mark.parametrize("case", sorted(DECODERS))
def test_decoder_folders_written_by_transformers_compute_what_it_computes(case, tmp_path):
    reference = _write(tmp_path / "hf", case, DECODERS)
    lm = CausalLM.from_pretrained(tmp_path / "hf")
    expected = _reference(reference, TOKENS)
    assert np.abs(to_numpy(lm(TOKENS)) - expected).max() <= 2e-5
    ids = lm.generate([TOKENS[0, :5].tolist()], max_new_tokens=6)[0]
    with torch.no_grad():
        theirs = reference.generate(
            torch.from_numpy(TOKENS[:1, :5].astype("int64")), max_new_tokens=6,
            min_new_tokens=6, do_sample=False, pad_token_id=0,
        )[0, 5:].tolist()  # fmt: skip
    assert ids == theirs
    # What we write, `transformers` reads back to the same numbers.
    model_type = reference.config.model_type
    lm.save_pretrained(tmp_path / "ours", model_type=model_type)
    again = getattr(transformers, DECODERS[case][1]).from_pretrained(tmp_path / "ours").eval()
    assert np.abs(_reference(again, TOKENS) - expected).max() <= 2e-5


@pytest.mark.parametrize("case", sorted(ENCODERS))
def test_encoder_folders_written_by_transformers_compute_what_it_computes(case, tmp_path):
    reference = _write(tmp_path / "hf", case, ENCODERS)
    model = load_pretrained(tmp_path / "hf")
    inputs = {"token_ids": TOKENS}
    if "segment_ids" in model.input:
        inputs["segment_ids"] = np.zeros_like(TOKENS)
    ours = to_numpy(model(inputs)["sequence_output"])
    expected = _reference(reference, TOKENS)
    assert np.abs(ours - expected).max() <= 2e-5
    save_pretrained(model, tmp_path / "ours")
    again = getattr(transformers, ENCODERS[case][1]).from_pretrained(tmp_path / "ours").eval()
    assert np.abs(_reference(again, TOKENS) - expected).max() <= 2e-5


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama")
    _write(folder, "llama_llama3", DECODERS)
    return folder


def _edited(folder, tmp_path, **changes):
    config = json.loads((folder / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    out = tmp_path / "edited"
    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps(config))
    (out / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
    return out


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"layer_types": ["full_attention", "sliding_attention"], "sliding_window": 8},
         "layer_types"),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}}, "yarn"),
        ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                              "partial_rotary_factor": 0.5}}, "partial_rotary_factor"),
        ({"rope_theta": 20.0}, "two rope_theta values"),
        ({"rope_parameters": {"rope_type": "default"}}, "lacks rope_theta"),
        ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
        ({"quantization_config": {"quant_method": "gptq"}}, "quantization_config"),
        ({"vocab_size": 3_000_000}, r"embed_tokens\.weight' has shape \(96, 32\)"),
        ({"vocab_size": 10**12}, r"vocabulary_size.*\[1, 16777216\]"),
        ({"hidden_size": 10**9}, "hidden_dim"),
        ({"num_hidden_layers": 100_000}, r"num_layers.*\[1, 1024\]"),
        ({"num_hidden_layers": 3}, r"lacks 'layers\.2"),
        ({"num_attention_heads": 5, "num_key_value_heads": 5, "head_dim": None},
         r"q_proj\.weight' has shape \(32, 32\); config.json's sizes need \(30, 32\)"),
        ({"num_key_value_heads": 3}, "multiple of num_key_value_heads"),
        ({"intermediate_size": "48"}, "intermediate_dim"),
    ],
)  # fmt: skip
def test_config_keys_and_sizes_are_understood_or_refused_before_building(
    llama_folder, tmp_path, changes, match
):
    with pytest.raises(ValueError, match=match):
        load_pretrained(_edited(llama_folder, tmp_path, **changes))


def test_legacy_and_new_rotary_forms_load_the_same_model(llama_folder, tmp_path):
    new = CausalLM.from_pretrained(llama_folder)
    legacy_scaling = {k: v for k, v in LLAMA3.items() if k != "rope_theta"}
    old = CausalLM.from_pretrained(
        _edited(llama_folder, tmp_path, rope_parameters=None, rope_theta=500000.0,
                rope_scaling=legacy_scaling)
    )  # fmt: skip
    np.testing.assert_array_equal(to_numpy(old(TOKENS)), to_numpy(new(TOKENS)))
    assert old.backbone.rope_max_wavelength == 500000.0


def test_an_encoder_config_that_changes_the_math_is_refused(tmp_path):
    _write(tmp_path / "hf", "bert", ENCODERS)
    for i, (changes, match) in enumerate(
        (
            ({"is_decoder": True}, "is_decoder"),
            ({"position_embedding_type": "relative_key"}, "absolute"),
            ({"type_vocab_size": 1000}, r"token_type_embeddings\.weight' has shape \(2, 32\)"),
        )
    ):
        edited = _edited(tmp_path / "hf", tmp_path / str(i), **changes)
        with pytest.raises(ValueError, match=match):
            load_pretrained(edited)


def _safetensors_bytes(tensors, dtype_of=None):
    """A safetensors file by hand: header JSON, then the raw bytes (dtypes relabelled at will)."""
    header, offset, blobs = {}, 0, []
    for key, value in tensors.items():
        data = np.ascontiguousarray(value).tobytes()
        dtype = (dtype_of or {}).get(key, "F32")
        header[key] = {"dtype": dtype, "shape": list(value.shape),
                       "data_offsets": [offset, offset + len(data)]}  # fmt: skip
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def test_mislabelled_and_corrupt_weight_files_are_named(llama_folder, tmp_path):
    from safetensors.numpy import load_file

    tensors = load_file(llama_folder / "model.safetensors")
    cases = {
        "relabelled": (
            _safetensors_bytes(tensors, {"model.norm.weight": "I32"}),
            r"floating point.*'norm\.weight': 'I32'",
        ),
        "huge_header": (
            struct.pack("<Q", 2**40) + _safetensors_bytes(tensors)[8:],
            "model.safetensors is not a valid safetensors file",
        ),
        "truncated": (
            _safetensors_bytes(tensors)[:-100],
            "model.safetensors is not a valid safetensors file",
        ),
        "bool_wrong_size": (
            _safetensors_bytes({**tensors, "model.x": np.zeros(3, "bool")}, {"model.x": "BOOL"})[
                :-1
            ],
            "model.safetensors is not a valid safetensors file",
        ),
    }
    for name, (data, match) in cases.items():
        folder = _edited(llama_folder, tmp_path / name)
        (folder / "model.safetensors").write_bytes(data)
        with pytest.raises(ValueError, match=match):
            load_pretrained(folder)
