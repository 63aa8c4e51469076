"""LoRA on our backbones: only the adapters (and a task's head) train, the adapters save and
load alone, `.keras` files keep them, and export merges them with parity to the adapted
model."""

import keras
import numpy as np
import pytest

from keras_attn.models import CausalLM
from tests.helpers import to_numpy
from tests.models.model_cases import build


def adapted(model):
    return sorted(la.path for la in model._flatten_layers() if getattr(la, "lora_enabled", False))


def perturb_adapters(model, seed=0):
    """B starts at zero (the adapted model equals the base); give the adapters a value."""
    rng = np.random.default_rng(seed)
    for layer in model._flatten_layers():
        if getattr(layer, "lora_enabled", False):
            layer.lora_kernel_b.assign(0.1 * rng.normal(size=layer.lora_kernel_b.shape))


def test_only_the_adapters_and_the_head_train():
    model, inputs, targets = build("classifier_cls")
    before = to_numpy(model(inputs))
    model.backbone.enable_lora(4)
    np.testing.assert_array_equal(to_numpy(model(inputs)), before)  # B = 0: unchanged
    assert adapted(model) == [
        "encoder_block_0/self_attention/query", "encoder_block_0/self_attention/value"
    ]  # fmt: skip
    names = sorted(w.path for w in model.trainable_weights)
    assert names == sorted(
        [f"encoder_block_0/self_attention/{p}/lora_kernel_{ab}" for p in ("query", "value")
         for ab in "ab"] + ["classifier/kernel", "classifier/bias"]
    )  # fmt: skip
    frozen = {w.path: to_numpy(w).copy() for w in model.backbone.weights}
    model.compile(optimizer="adam")
    model.fit(inputs, targets, epochs=2, verbose=0)
    changed = sorted(w.path for w in model.backbone.weights
                     if not np.array_equal(to_numpy(w), frozen[w.path]))  # fmt: skip
    assert changed == [n for n in names if "lora" in n]
    assert not np.allclose(to_numpy(model(inputs)), before)


def test_target_rank_and_alpha_and_their_errors():
    lm = CausalLM(40, 16, hidden_dim=16, num_heads=2, gated_feed_forward=True)
    lm.backbone.enable_lora(2, target=["query", "key", "gate"], alpha=8.0)
    layers = [la for la in lm._flatten_layers() if getattr(la, "lora_enabled", False)]
    assert sorted(la.name for la in layers) == ["gate", "gate", "key", "key", "query", "query"]
    assert {(la.lora_rank, la.lora_alpha) for la in layers} == {(2, 8.0)}
    with pytest.raises(ValueError, match="once"):
        lm.backbone.enable_lora(2)
    fresh = CausalLM(40, 16, hidden_dim=16, num_heads=2)
    for kwargs, match in (({"rank": 0}, "rank=0"), ({"rank": 2, "target": "qkv"}, "target"),
                          ({"rank": 2, "alpha": -1.0}, "alpha")):  # fmt: skip
        with pytest.raises(ValueError, match=match):
            fresh.backbone.enable_lora(**kwargs)
    assert adapted(fresh) == []


def test_adapters_save_and_load_alone(tmp_path):
    model, inputs, _ = build("causal_lm_llama")
    model.backbone.enable_lora(4, target=("query", "value", "intermediate"))
    perturb_adapters(model)
    expected = to_numpy(model(inputs))
    model.backbone.save_lora_weights(tmp_path / "adapters.safetensors")
    other, _, _ = build("causal_lm_llama")  # the same base weights (seeded)
    other.backbone.load_lora_weights(tmp_path / "adapters.safetensors")  # enables LoRA as saved
    np.testing.assert_allclose(to_numpy(other(inputs)), expected, atol=1e-6)
    with pytest.raises(ValueError, match="no LoRA adapters"):
        build("causal_lm")[0].backbone.save_lora_weights(tmp_path / "none.safetensors")
    wrong, _, _ = build("causal_lm")  # the same layer paths, other shapes
    with pytest.raises(ValueError, match=r"intermediate/lora_kernel_a has shape \(32, 4\)"):
        wrong.backbone.load_lora_weights(tmp_path / "adapters.safetensors")
    assert adapted(wrong) == []  # refused before anything was enabled
    # A truncated file, or one whose settings are not ours, is named, not a SafetensorError.
    data = (tmp_path / "adapters.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[:-10])
    with pytest.raises(ValueError, match=r"cut\.safetensors is not a valid safetensors file"):
        other.backbone.load_lora_weights(tmp_path / "cut.safetensors")
    with pytest.raises(ValueError, match="does not exist"):
        other.backbone.load_lora_weights(tmp_path / "missing.safetensors")


def test_keras_file_keeps_the_adapters_and_their_freezing(tmp_path):
    model, inputs, _ = build("causal_lm_llama")
    model.backbone.enable_lora(4)
    perturb_adapters(model)
    model.save(tmp_path / "lora.keras")
    again = keras.saving.load_model(tmp_path / "lora.keras")
    np.testing.assert_array_equal(to_numpy(again(inputs)), to_numpy(model(inputs)))
    assert adapted(again) == adapted(model)
    assert sorted(w.path for w in again.backbone.trainable_weights) == sorted(
        w.path for w in model.backbone.trainable_weights
    )


def test_quantized_backbone_with_adapters_trains_the_adapters_only():
    model, inputs, targets = build("classifier_cls")
    model.quantize("int8")  # QLoRA-style: int8 base, float adapters
    model.backbone.enable_lora(4)
    perturb_adapters(model)
    kernels = {la.path: to_numpy(la._kernel).copy() for la in model._flatten_layers()
               if getattr(la, "lora_enabled", False)}  # fmt: skip
    model.compile(optimizer="adam")
    model.fit(inputs, targets, epochs=1, verbose=0)
    for layer in model._flatten_layers():
        if layer.path in kernels:
            np.testing.assert_array_equal(to_numpy(layer._kernel), kernels[layer.path])
            assert to_numpy(layer._kernel).dtype == np.int8


@pytest.mark.tf_only
@pytest.mark.slow
@pytest.mark.parametrize("name", ["classifier_cls", "causal_lm_llama"])
def test_export_merges_the_adapters_with_parity_to_the_adapted_model(name, tmp_path):
    import onnx
    from keras_attn_export import export_model

    model, _, _ = build(name)
    model.backbone.enable_lora(4)
    perturb_adapters(model)
    manifest = export_model(model, tmp_path / "x", formats=["onnx"], verbose=False)
    assert max(row["onnx_vs_keras"] for row in manifest["parity"]["rows"]) <= 1e-4
    graph = onnx.load(tmp_path / "x" / "model.onnx").graph
    assert not [t.name for t in graph.initializer if "lora" in t.name]  # merged, not added
    assert adapted(model)  # the model itself keeps its adapters
    if name == "causal_lm_llama":
        from keras_attn_serving import Predictor

        prompts = [[5, 6, 7], [9, 3]]
        assert Predictor(tmp_path / "x").generate_ids(prompts, 6) == model.generate(prompts, 6)
