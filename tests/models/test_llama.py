"""The Llama family (Llama, Mistral, Qwen2) as `DecoderBackbone` configurations: Hugging Face
folders against an independent float64 NumPy forward (`llama_reference`), round trips,
left padding, cached generation, and the `.keras` file."""

import json

import keras
import numpy as np
import pytest
from safetensors.numpy import load_file

from keras_attn.layers.rotary_embedding import check_rope_scaling
from keras_attn.models import CausalLM, DecoderBackbone
from keras_attn.pretrained import load_pretrained
from keras_attn.pretrained.registry import layout_for_model
from tests.helpers import run_in_fresh_process, to_numpy
from tests.models import llama_reference as ref

LLAMA3_SCALING = {
    "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}  # fmt: skip
CASES = {
    "llama": ("llama", {}),
    "llama3_scaling_biases": (
        "llama", {"rope_scaling": LLAMA3_SCALING, "attention_bias": True, "mlp_bias": True}
    ),
    "llama_head_dim_linear": (
        "llama", {"head_dim": 16, "rope_scaling": {"type": "linear", "factor": 2.0}}
    ),
    "mistral": ("mistral", {"num_key_value_heads": 1}),
    "qwen2_tied": ("qwen2", {}),
    "qwen2_untied": ("qwen2", {"tie_word_embeddings": False, "num_key_value_heads": 4}),
}  # fmt: skip
RNG = np.random.default_rng(0)


def _folder(tmp_path, case, shards=1):
    model_type, overrides = CASES[case]
    config, weights = ref.random_checkpoint(model_type, seed=len(case), **overrides)
    ref.write_folder(tmp_path / case, config, weights, shards=shards)
    return tmp_path / case, config, weights


@pytest.mark.parametrize("case", sorted(CASES))
def test_layout_matches_the_float64_forward_and_round_trips_exactly(case, tmp_path):
    folder, config, weights = _folder(tmp_path, case, shards=3 if case == "llama" else 1)
    lm = CausalLM.from_pretrained(folder)
    assert lm.position_encoding == "rotary" and lm.normalization == "rms_norm"
    token_ids = RNG.integers(0, config["vocab_size"], size=(2, 11)).astype("int32")
    ours = to_numpy(lm(token_ids)).astype("float64")
    expected = ref.forward(config, weights, token_ids)
    assert np.abs(ours - expected).max() <= 1e-5, np.abs(ours - expected).max()
    # Round trip, sharded: every tensor back bit for bit, the architecture fields unchanged.
    # Mistral is Llama's computation: without `model_type` it is written as Llama.
    inferred = "llama" if config["model_type"] == "mistral" else config["model_type"]
    assert layout_for_model(lm.backbone)[1] == inferred
    lm.save_pretrained(tmp_path / "out", model_type=config["model_type"], max_shard_size=20_000)
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and not (tmp_path / "out" / "model.safetensors").exists()
    written = {k: v for shard in shards for k, v in load_file(tmp_path / "out" / shard).items()}
    assert set(written) == set(weights)
    for key, value in weights.items():
        np.testing.assert_array_equal(written[key], value, err_msg=key)
    config_out = json.loads((tmp_path / "out" / "config.json").read_text())
    fields = ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
              "num_attention_heads", "num_key_value_heads", "rms_norm_eps",
              "tie_word_embeddings", "max_position_embeddings")  # fmt: skip
    assert {k: config_out[k] for k in fields} == {k: config[k] for k in fields}
    assert config_out.get("head_dim", 8) == config.get("head_dim", 8)
    # Rotary settings in transformers 5's form, whichever form was read.
    scaling = check_rope_scaling(config["rope_scaling"]) or {"rope_type": "default"}
    assert config_out["rope_parameters"] == {**scaling, "rope_theta": config["rope_theta"]}
    assert "rope_theta" not in config_out and "rope_scaling" not in config_out
    again = CausalLM.from_pretrained(tmp_path / "out")
    np.testing.assert_array_equal(to_numpy(again(token_ids)), to_numpy(lm(token_ids)))
    # Rewriting the folder with fewer shards, then as one file, leaves no earlier shard.
    lm.save_pretrained(tmp_path / "out", model_type=config["model_type"], max_shard_size=60_000)
    fewer = set(json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())[
        "weight_map"].values())  # fmt: skip
    assert len(fewer) < len(shards)
    assert {p.name for p in (tmp_path / "out").glob("model-*.safetensors")} == fewer
    lm.save_pretrained(tmp_path / "out", model_type=config["model_type"])
    assert sorted(p.name for p in (tmp_path / "out").glob("*.safetensors")) == ["model.safetensors"]


@pytest.mark.parametrize("case", ["llama3_scaling_biases", "qwen2_tied"])
def test_left_padded_rows_equal_the_rows_alone(case, tmp_path):
    folder, config, weights = _folder(tmp_path, case)
    backbone = DecoderBackbone.from_pretrained(folder, padding_mask_input=True)
    lm = CausalLM(backbone)
    token_ids = RNG.integers(3, config["vocab_size"], size=(3, 9)).astype("int32")
    mask = np.ones_like(token_ids)
    mask[1, :4], mask[2, :7] = 0, 0
    token_ids[mask == 0] = 0
    ours = to_numpy(lm({"token_ids": token_ids, "padding_mask": mask})).astype("float64")
    expected = ref.forward(config, weights, token_ids, attention_mask=mask)
    real = mask.astype(bool)
    assert np.abs(ours - expected)[real].max() <= 1e-5
    alone = to_numpy(lm({"token_ids": token_ids[2:, 7:], "padding_mask": mask[2:, 7:]}))
    np.testing.assert_allclose(ours[2, 7:], alone[0], atol=1e-5)


def test_generate_with_the_cache_equals_full_recomputation(tmp_path):
    folder, config, weights = _folder(tmp_path, "llama3_scaling_biases")
    lm = CausalLM.from_pretrained(folder)
    prompts = [[5, 6, 7, 8], [9, 3], [11, 12, 13, 14, 15, 16, 17]]
    cached = lm.generate(prompts, max_new_tokens=8)
    assert cached == lm.generate(prompts, max_new_tokens=8, use_cache=False)
    # The first greedy id of each prompt is the float64 forward's argmax.
    for prompt, new in zip(prompts, cached, strict=True):
        assert new[0] == ref.forward(config, weights, np.array([prompt]))[0, -1].argmax()
    sampled = lm.generate(prompts, max_new_tokens=6, sampler="sample", top_k=5, seed=3)
    assert sampled == lm.generate(prompts, 6, sampler="sample", top_k=5, seed=3, use_cache=False)


def test_gqa_equals_full_attention_with_repeated_key_value_heads(tmp_path):
    config, weights = ref.random_checkpoint("llama", seed=4)
    groups = config["num_attention_heads"] // config["num_key_value_heads"]
    full = dict(weights)
    for i in range(config["num_hidden_layers"]):
        for name in ("k_proj", "v_proj"):
            key = f"model.layers.{i}.self_attn.{name}.weight"
            heads = weights[key].reshape(config["num_key_value_heads"], -1, config["hidden_size"])
            full[key] = np.repeat(heads, groups, axis=0).reshape(-1, config["hidden_size"])
    ref.write_folder(tmp_path / "gqa", config, weights)
    ref.write_folder(tmp_path / "mha", {**config, "num_key_value_heads": 4}, full)
    token_ids = np.array([[4, 9, 16, 25, 36, 49]], "int32")
    gqa = to_numpy(CausalLM.from_pretrained(tmp_path / "gqa")(token_ids))
    mha = to_numpy(CausalLM.from_pretrained(tmp_path / "mha")(token_ids))
    np.testing.assert_allclose(gqa, mha, atol=1e-6)


def test_mistral_sliding_window_caps_the_context(tmp_path):
    config, weights = ref.random_checkpoint("mistral", sliding_window=12)
    ref.write_folder(tmp_path, config, weights)
    lm = CausalLM.from_pretrained(tmp_path)
    assert lm.max_sequence_length == 12  # within the window, attention is exact
    token_ids = RNG.integers(0, 97, size=(1, 12)).astype("int32")
    expected = ref.forward(config, weights, token_ids)
    assert np.abs(to_numpy(lm(token_ids)) - expected).max() <= 1e-5
    with pytest.raises(ValueError, match="context length 12"):
        lm.generate([list(range(1, 10))], max_new_tokens=5)


@pytest.mark.parametrize(
    "change, match",
    [
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_type='yarn'"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "low_freq_factor"),
        ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
    ],
)
def test_unsupported_configs_are_named(change, match, tmp_path):
    config, weights = ref.random_checkpoint("llama")
    ref.write_folder(tmp_path, {**config, **change}, weights)
    with pytest.raises(ValueError, match=match):
        load_pretrained(tmp_path)


def test_untied_checkpoint_loaded_into_a_tied_model_is_refused(tmp_path):
    folder, _, _ = _folder(tmp_path, "llama")
    with pytest.raises(ValueError, match=r"differs from 'embed_tokens\.weight'"):
        load_pretrained(folder, tie_word_embeddings=True)


def test_layout_arguments_a_checkpoint_cannot_express_are_named(tmp_path):
    lm = CausalLM(50, 16, hidden_dim=16, num_heads=2, position_encoding="rotary",
                  normalization="rms_norm", gated_feed_forward=True)  # fmt: skip
    with pytest.raises(ValueError, match="activation"):
        lm.save_pretrained(tmp_path)  # gelu: Llama's MLP is SwiGLU
    with pytest.raises(ValueError, match="max_shard_size"):
        lm.save_pretrained(tmp_path, max_shard_size=0)


def test_llama_keras_file_reloads_in_a_fresh_process(tmp_path):
    folder, _, _ = _folder(tmp_path, "llama3_scaling_biases")
    lm = CausalLM.from_pretrained(folder)
    lm.save(tmp_path / "lm.keras")
    token_ids = [[3, 1, 4, 1, 5, 9, 2, 6]]
    expected = to_numpy(lm(np.array(token_ids))).tolist()
    script = (
        "import sys, json, numpy as np, keras\n"
        "import keras_attn\n"
        "lm = keras.saving.load_model(sys.argv[1])\n"
        "out = lm(np.array(json.loads(sys.argv[2])))\n"
        "print('RESULT', json.dumps([keras.ops.convert_to_numpy(out).tolist(),"
        " lm.backbone.rope_scaling]))\n"
    )
    got, scaling = run_in_fresh_process(script, tmp_path / "lm.keras", json.dumps(token_ids))
    np.testing.assert_allclose(np.array(got), np.array(expected), atol=1e-6)
    assert scaling["rope_type"] == "llama3"


def test_mixed_precision_llama_trains_with_float32_logits():
    keras.mixed_precision.set_dtype_policy("mixed_bfloat16")
    try:
        lm = CausalLM(
            40, 16, hidden_dim=16, num_heads=2, num_key_value_heads=1,
            position_encoding="rotary", normalization="rms_norm", gated_feed_forward=True,
            activation="swish", attention_bias=False, feed_forward_bias=False,
            tie_word_embeddings=False, mask_zero=False,
        )  # fmt: skip
        lm.compile(optimizer="adam")
        x = np.tile(np.arange(1, 9, dtype="int32"), (4, 1))
        history = lm.fit(x[:, :-1], x[:, 1:], epochs=2, verbose=0)
        assert np.isfinite(history.history["loss"]).all()
        assert to_numpy(lm(x)).dtype == np.float32
    finally:
        keras.mixed_precision.set_dtype_policy("float32")


def test_cross_attention_keeps_no_rotary_and_gpt2_refuses_llama_arguments(tmp_path):
    import keras_attn as ka

    block = ka.TransformerDecoder(num_heads=2, intermediate_dim=16, rope_max_wavelength=1e4)
    block(np.zeros((1, 3, 8), "float32"), np.zeros((1, 5, 8), "float32"))
    assert block.self_attention.rope_max_wavelength == 1e4
    assert block.cross_attention.rope_max_wavelength is None  # keys are the encoder's
    lm = CausalLM(40, 16, hidden_dim=16, num_heads=2, num_key_value_heads=1)
    with pytest.raises(ValueError, match="num_key_value_heads"):
        lm.save_pretrained(tmp_path)  # GPT-2's fused c_attn holds equal q, k, v widths


def test_silu_is_swish_when_writing_a_checkpoint(tmp_path):
    """Issue 41 item 14: the docstring's `activation="silu"` built but `save_pretrained`
    refused it (only "swish" was known); both names are Keras's one function."""
    kwargs = dict(
        vocabulary_size=64, max_sequence_length=16, hidden_dim=16, num_layers=1, num_heads=2,
        position_encoding="rotary", normalization="rms_norm", gated_feed_forward=True,
        normalize_first=True, mask_zero=False, num_key_value_heads=1, attention_bias=False,
        feed_forward_bias=False, tie_word_embeddings=False, rope_max_wavelength=10000.0,
    )  # fmt: skip
    keras.utils.set_random_seed(0)
    lm = CausalLM(DecoderBackbone(activation="silu", **kwargs))
    lm.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["hidden_act"] == "silu"
    again = CausalLM.from_pretrained(tmp_path)
    ids = np.array([[3, 9, 27, 5]], "int32")
    np.testing.assert_allclose(to_numpy(again(ids)), to_numpy(lm(ids)), atol=1e-6)
