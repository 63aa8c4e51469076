"""Every model family exports to SavedModel and ONNX with parity; fused and int8 files; CLI."""

import json
import subprocess
import sys

import keras
import numpy as np
import onnx
import pytest
from keras_attn_export import ParityError, export_model
from keras_attn_export.cli import main as cli_main
from keras_attn_export.onnx import run_onnx
from keras_attn_export.optimize import count_ops

from keras_attn.layers import MultiHeadAttention, TransformerEncoder
from keras_attn.models import CausalLM, Encoder
from tests.models.model_cases import MODELS, build

pytestmark = [pytest.mark.tf_only, pytest.mark.slow]


def lstm_attention():
    sys.path.insert(0, "examples")
    try:
        from dates_lstm_attention import build as build_lstm
    finally:
        sys.path.pop(0)
    keras.utils.set_random_seed(0)
    return build_lstm(20, units=16, embedding_dim=8)


@pytest.mark.parametrize("name", [*MODELS, "lstm_attention"])
def test_every_family_exports_with_parity_in_both_formats(name, tmp_path):
    model = lstm_attention() if name == "lstm_attention" else build(name)[0]
    manifest = export_model(model, tmp_path / name, optimize=True, verbose=False)
    columns = {"saved_model_vs_keras", "onnx_vs_keras", "onnx_opt_vs_keras"}
    rows = manifest["parity"]["rows"]
    assert {(r["batch"], r["seq"]) for r in rows} == {(1, 7), (1, 16), (3, 7), (3, 16)}
    for row in rows:
        assert columns <= set(row)
        assert all(row[c] <= 1e-4 for c in columns), row
    assert {o["name"] for o in manifest["outputs"]} == {r["output"] for r in rows}
    assert manifest["onnx"]["files"] == ["model.onnx", "model.opt.onnx"]
    assert manifest["onnx"]["file"] == "model.opt.onnx"  # served
    # Encoders whose outputs read real positions alone skip padding (test_unpad.py), mean
    # pooling, span logits and merged choices included; a cross-attention, a causal mask or a
    # masked-LM gather at any position do not.
    heads = ("classifier_cls", "classifier_mean", "token_classifier", "span_qa", "multiple_choice")
    unpadded = name in heads
    assert set(manifest["onnx"]["unpadded"]) == ({"model.opt.onnx"} if unpadded else set())
    # onnxruntime's optimizer fuses neither rotary attention nor our RMSNorm: the Llama-family
    # graph is checked for parity only (its decode graph is hand-written: decode_gqa.onnx);
    # nor T5's unscaled scores plus a relative position bias.
    if name not in ("lstm_attention", "causal_lm_llama", "seq2seq_t5"):
        # Every block's LayerNorms are fused, and every attention layer is one node: a
        # self-attention's q, k, v packed into `Attention`, a cross-attention (keys and
        # values from another input) a `MultiHeadAttention`; the unoptimized file has none.
        fused = manifest["onnx"]["fused_ops"]["model.opt.onnx"]
        norms = fused.get("LayerNormalization", 0) + fused.get("SkipLayerNormalization", 0)
        assert norms >= 2
        attention = [la for la in model._flatten_layers() if isinstance(la, MultiHeadAttention)]
        nodes = fused.get("Attention", 0) + fused.get("MultiHeadAttention", 0)
        assert nodes == len(attention) >= 1 and fused.get("Attention", 0) >= 1
        assert manifest["onnx"]["fused_ops"]["model.onnx"] == {}


def test_fused_operator_counts_are_exact_and_outputs_unchanged(tmp_path):
    keras.utils.set_random_seed(0)
    encoder = Encoder(50, 16, hidden_dim=16, num_layers=2, num_heads=2, activation="gelu")
    manifest = export_model(encoder, tmp_path / "enc", formats=["onnx"], optimize=True,
                            verbose=False)  # fmt: skip
    fused = count_ops(onnx.load(tmp_path / "enc/model.opt.onnx"))
    # Token + position + segment lookups and their LayerNorm as one node, 2 LayerNorms per
    # block with the residual added in; one exact GELU and one packed-QKV attention per block.
    assert fused == {
        "EmbedLayerNormalization": 1, "SkipLayerNormalization": 4, "Gelu": 2, "Attention": 2
    }  # fmt: skip
    assert manifest["onnx"]["fused_ops"]["model.opt.onnx"] == fused
    assert manifest["saved_model"] is None and not (tmp_path / "enc/saved_model").exists()
    # A constant row (variance 0) stays finite: the fused node keeps the epsilon.
    import onnxruntime as ort

    session = ort.InferenceSession(str(tmp_path / "enc/model.opt.onnx"))
    ids = np.full((1, 5), 7, "int32")
    out = run_onnx(session, {"token_ids": ids, "segment_ids": np.zeros_like(ids)})
    ref = encoder({"token_ids": ids, "segment_ids": np.zeros_like(ids)})
    np.testing.assert_allclose(out["sequence_output"], ref["sequence_output"], atol=1e-4)


@pytest.mark.parametrize("attention", [{"num_key_value_heads": 1}, {"score": "additive"}])
def test_attention_onnxruntime_cannot_fuse_exports_unfused_with_parity(attention, tmp_path):
    # Grouped-query heads and non-scaled-dot scores keep their explicit graph.
    keras.utils.set_random_seed(0)
    ids = keras.Input((None,), dtype="int32", name="token_ids")
    x = keras.layers.Embedding(50, 16, mask_zero=True)(ids)
    x = TransformerEncoder(2, 32, **attention)(x)
    model = keras.Model(ids, keras.layers.Dense(3, name="logits")(x))
    manifest = export_model(model, tmp_path / "m", formats=["onnx"], optimize=True,
                            verbose=False)  # fmt: skip
    fused = manifest["onnx"]["fused_ops"]["model.opt.onnx"]
    assert not {"Attention", "MultiHeadAttention"} & set(fused)
    assert fused["SkipLayerNormalization"] == 2
    assert manifest["parity"]["max_abs_diff"] <= 1e-4


@pytest.mark.parametrize("weights", ["s8", "u8", None])
def test_int8_reports_drift_and_agreement_instead_of_failing(tmp_path, weights):
    """A forced weight type's drift is reported, whatever it is on this CPU (signed weights
    drifted 69% on an AVX2-only one); the measured choice is the faster type within the
    drift bound, both measurements recorded."""
    from keras_attn_export.hardware import DRIFT_BOUND, pick

    model = build("classifier_cls")[0]
    manifest = export_model(model, tmp_path / "q", formats=["onnx"], optimize=True,
                            quantize="int8", int8_weights=weights, verbose=False)  # fmt: skip
    assert (tmp_path / "q/model.int8.onnx").is_file()
    quantization = manifest.quantization.model_dump()
    candidates = quantization["candidates"]
    assert quantization["drift_bound"] == DRIFT_BOUND
    if weights is None:
        assert quantization["chosen_by"] == "measurement"
        assert set(candidates) == {"s8", "u8"}
        assert quantization["weights"] == pick(candidates)
    else:
        assert quantization["chosen_by"] == "argument"
        assert set(candidates) == {weights} and quantization["weights"] == weights
    chosen = candidates[quantization["weights"]]
    assert chosen["ms"] > 0
    int8_graph = onnx.load(tmp_path / "q/model.int8.onnx").graph
    # The first feed-forward output projection (input: a GELU output; this model has one
    # block, so one of the two kept) stays float32.
    from keras_attn_export.optimize import fuse, gelu_fed_matmuls

    unpacked = fuse(onnx.load(tmp_path / "q/model.onnx"), pack_qkv=False)
    assert quantization["float_matmuls"] == gelu_fed_matmuls(unpacked)[:2]
    assert len(quantization["float_matmuls"]) == 1
    float_matmuls = {n.name for n in int8_graph.node if n.op_type == "MatMul"}
    assert set(quantization["float_matmuls"]) <= float_matmuls
    weight_types = {t.data_type for t in int8_graph.initializer}
    wanted = {"s8": onnx.TensorProto.INT8, "u8": onnx.TensorProto.UINT8}[quantization["weights"]]
    assert wanted in weight_types
    # The manifest's drift is the kept file's, measured here again from its session.
    drift = manifest["int8"]["logits"]
    assert drift["relative_drift"] == pytest.approx(chosen["relative_drift"])
    assert 0.0 < drift["max_abs_diff"] and np.isfinite(drift["relative_drift"])
    assert 0.0 <= drift["argmax_agreement"] <= 1.0
    if weights is None and min(c["relative_drift"] for c in candidates.values()) <= DRIFT_BOUND:
        assert drift["relative_drift"] <= DRIFT_BOUND
    fused = manifest["onnx"]["fused_ops"]["model.int8.onnx"]
    assert fused.get("MatMulIntegerToFloat", 0) + fused.get("DynamicQuantizeMatMul", 0) > 0


def test_int8_pick_keeps_the_fastest_type_within_the_drift_bound():
    """Both branches of the rule, whatever this CPU measures."""
    from keras_attn_export.hardware import pick

    fast_and_wrong = {"s8": {"relative_drift": 0.69, "ms": 1.0},
                      "u8": {"relative_drift": 0.02, "ms": 2.0}}  # fmt: skip
    assert pick(fast_and_wrong) == "u8"
    both_good = {"s8": {"relative_drift": 0.02, "ms": 1.0},
                 "u8": {"relative_drift": 0.01, "ms": 1.7}}  # fmt: skip
    assert pick(both_good) == "s8"
    both_bad = {"s8": {"relative_drift": 0.5, "ms": 1.0}, "u8": {"relative_drift": 0.3, "ms": 9.0}}
    assert pick(both_bad) == "u8"
    assert pick(both_good, bound=0.015) == "u8"


def test_mixed_precision_models_export_as_float32(tmp_path):
    keras.mixed_precision.set_dtype_policy("mixed_bfloat16")
    try:
        model = build("causal_lm")[0]
    finally:
        keras.mixed_precision.set_dtype_policy("float32")
    manifest = export_model(model, tmp_path / "bf16", formats=["onnx"], verbose=False)
    graph = onnx.load(tmp_path / "bf16/model.onnx").graph
    bf16 = onnx.TensorProto.BFLOAT16
    assert all(t.data_type != bf16 for t in graph.initializer)
    assert manifest["parity"]["max_abs_diff"] <= 1e-4  # vs the float32 copy of the model
    ids = MODELS["causal_lm"][1]
    import onnxruntime as ort

    out = run_onnx(ort.InferenceSession(str(tmp_path / "bf16/model.onnx")), {"token_ids": ids})
    bf16_logits = keras.ops.convert_to_numpy(model(ids))
    np.testing.assert_allclose(out["logits"], bf16_logits, atol=0.1)  # bf16 rounding only


def test_export_works_whatever_the_global_dtype_policy(tmp_path):
    """A `mixed_bfloat16` global policy left set made tracing build bf16 layers beside float32
    ones (onnxruntime: "MatMul bound to different types"); export restores the policy."""
    model = build("causal_lm")[0]
    keras.mixed_precision.set_dtype_policy("mixed_bfloat16")
    try:
        manifest = export_model(model, tmp_path / "m", formats=["onnx"], verbose=False)
        assert keras.config.dtype_policy().name == "mixed_bfloat16"
    finally:
        keras.mixed_precision.set_dtype_policy("float32")
    assert manifest["parity"]["max_abs_diff"] <= 1e-4
    assert manifest["decoding"]["gqa"]["step_logits_max_abs_diff"] <= 1e-4


def test_export_names_the_backend_it_needs(monkeypatch, tmp_path):
    model = build("causal_lm")[0]
    monkeypatch.setattr(keras.backend, "backend", lambda: "jax")
    with pytest.raises(ValueError, match=r"TensorFlow backend.*Received backend: 'jax'"):
        export_model(model, tmp_path / "m")


def test_per_output_tolerance_and_bad_arguments(tmp_path):
    model = build("span_qa")[0]
    with pytest.raises(ParityError, match="end_logits"):
        export_model(model, tmp_path / "t", formats=["onnx"], verbose=False,
                     tolerance={"start_logits": 1e-4, "end_logits": 0.0})  # fmt: skip
    assert not (tmp_path / "t").exists()
    with pytest.raises(ValueError, match="formats"):
        export_model(model, tmp_path / "t", formats=["tflite"])
    with pytest.raises(ValueError, match="quantize"):
        export_model(model, tmp_path / "t", quantize="int4")
    with pytest.raises(ValueError, match="`int8_weights` must be one of"):
        export_model(model, tmp_path / "t", quantize="int8", int8_weights="s4")
    with pytest.raises(ValueError, match="`int8_weights` needs `quantize='int8'`"):
        export_model(model, tmp_path / "t", int8_weights="s8")
    with pytest.raises(ValueError, match="opset"):
        export_model(model, tmp_path / "t", optimize=True, opset=16)
    with pytest.raises(ValueError, match="formats"):
        export_model(model, tmp_path / "t", formats=["saved_model"], optimize=True)


def test_cli_exports_a_keras_file(tmp_path, capsys):
    model = build("token_classifier")[0]
    model.save(tmp_path / "tagger.keras")
    out = tmp_path / "artifact"
    code = cli_main([str(tmp_path / "tagger.keras"), str(out), "--formats", "onnx",
                     "--optimize", "--quantize", "int8"])  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out  # the parity table, then the int8 drift
    assert "onnx_vs_keras" in printed and "argmax agreement" in printed
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["onnx"]["files"] == ["model.onnx", "model.opt.onnx", "model.int8.onnx"]
    # int8 quantizes the fused graph, padding skipped too; its drift is at real positions.
    assert set(manifest["onnx"]["unpadded"]) == {"model.opt.onnx", "model.int8.onnx"}
    assert cli_main([str(tmp_path / "tagger.keras"), str(out), "--formats", "tflite"]) == 1
    # The console script is installed and answers --help.
    help_text = subprocess.run(
        [sys.executable, "-m", "keras_attn_export.cli", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "--quantize" in help_text and "--opset" in help_text


@pytest.mark.parametrize(
    "kwargs",
    [
        {"normalize_first": False, "position_encoding": "sinusoidal", "activation": "relu"},
        {"activation": "gelu_tanh", "hidden_dim": 32, "num_heads": 4},
        {"activation": "swish", "num_layers": 1},
    ],
)
def test_gqa_decode_graph_matches_keras_for_each_block_variant(tmp_path, kwargs):
    # export_model raises unless decode_gqa.onnx gives Keras's logits at every step (<= 1e-4)
    # and Keras generate()'s greedy ids; here every branch of the graph builder runs.
    from keras_attn_serving import Predictor

    keras.utils.set_random_seed(2)
    lm = CausalLM(50, 20, **{"hidden_dim": 16, "num_layers": 2, "num_heads": 2, **kwargs})
    gqa = export_model(lm, tmp_path / "lm", formats=["onnx"], verbose=False)["decoding"]["gqa"]
    assert gqa["file"] == "decode_gqa.onnx" and gqa["step_logits_max_abs_diff"] <= 1e-4
    prompts = [[4, 8, 15, 16], [23, 42]]
    assert Predictor(tmp_path / "lm").generate_ids(prompts, 12) == lm.generate(prompts, 12)


def test_models_the_gqa_graph_cannot_express_keep_decode_onnx(tmp_path, monkeypatch):
    from keras_attn_export.decode_graph import supported
    from keras_attn_serving import Predictor

    from keras_attn.layers.scores import ScaledDotScore

    keras.utils.set_random_seed(3)
    lm = CausalLM(40, 16, hidden_dim=16, num_layers=1, num_heads=2)
    assert supported(lm) is None
    monkeypatch.setattr(ScaledDotScore, "is_scaled_dot", False)  # as if another score
    assert "is not scaled dot" in supported(lm)
    decoding = export_model(lm, tmp_path / "lm", formats=["onnx"], verbose=False)["decoding"]
    assert decoding["file"] == "decode.onnx" and decoding["gqa"]["file"] is None
    assert "is not scaled dot" in decoding["gqa"]["unsupported"]
    assert not (tmp_path / "lm" / "decode_gqa.onnx").exists()
    predictor = Predictor(tmp_path / "lm")
    assert predictor.gqa_session is None
    assert predictor.generate_ids([[3, 4, 5]], 6) == lm.generate([[3, 4, 5]], 6)


def test_cached_decoding_graph_matches_keras_generate(tmp_path):
    from keras_attn_serving import Predictor

    keras.utils.set_random_seed(1)
    lm = CausalLM(60, 24, hidden_dim=16, num_layers=2, num_heads=2)
    manifest = export_model(lm, tmp_path / "lm", formats=["onnx"], verbose=False)
    decoding = manifest["decoding"]
    assert decoding["file"] == "decode.onnx" and decoding["greedy_equals_keras"]
    assert decoding["step_logits_max_abs_diff"] <= 1e-4
    assert (decoding["layers"], decoding["kv_heads"], decoding["key_dim"]) == (2, 2, 8)
    gqa = decoding["gqa"]
    assert gqa["file"] == "decode_gqa.onnx" and gqa["greedy_equals_keras"]
    assert gqa["step_logits_max_abs_diff"] <= 1e-4
    assert (gqa["layers"], gqa["kv_heads"], gqa["key_dim"], gqa["max_length"]) == (2, 2, 8, 24)
    predictor = Predictor(tmp_path / "lm")
    prompts = [[5, 6, 7], [9, 3, 12, 4, 8], [2]]
    expected = lm.generate(prompts, 10)
    for graph in ("gqa_step", "decode_step"):  # decode_gqa.onnx (the default), decode.onnx
        calls = []
        step = getattr(predictor, graph)
        setattr(predictor, graph, lambda *a, s=step, c=calls: c.append(a[0].shape) or s(*a))
        use_cache = True if graph == "gqa_step" else "decode.onnx"
        cached = predictor.generate_ids(prompts, 10, use_cache=use_cache)
        assert cached == expected
        # One prefill of the shortest prompt, then one token per call: the prefix is never
        # rerun.
        assert calls[0] == (3, 1) and all(shape == (3, 1) for shape in calls[1:])
        assert len(calls) == 1 + (5 + 10 - 1) - 1
    assert expected == predictor.generate_ids(prompts, 10, use_cache=False)
    # A stop token ends its row and is not returned, as in Keras; other rows go on.
    stop = cached[0][2]
    stopped = predictor.generate_ids(prompts, 10, stop_token_ids=[stop])
    for full, cut in zip(cached, stopped, strict=True):
        assert cut == (full[: full.index(stop)] if stop in full else full)
    assert stopped == lm.generate(prompts, 10, stop_token_ids=[stop])
    with pytest.raises(ValueError, match="maximum sequence length"):
        predictor.generate_ids(prompts, 30)


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
    from keras_attn.hardware import cpu_flags, native_low_precision

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor : 0\nflags : fpu avx2 avx512f avx512_vnni sse\n")
    assert cpu_flags(cpuinfo) == ["avx2", "avx512_vnni", "avx512f"]
    assert cpu_flags(tmp_path / "none") == []
    assert native_low_precision("bfloat16", ["avx512_bf16"])
    assert native_low_precision("bfloat16", ["amx_bf16", "amx_tile"])
    assert not native_low_precision("bfloat16", ["avx2", "avx512f", "avx512_vnni"])
    assert not native_low_precision("float32", ["avx512_bf16"])


def test_a_new_family_decodes_maps_and_exports_with_no_change_outside_it(tmp_path):
    """The toy family (tests/models/toy_family.py) is one file: cached decoding equals full
    recomputation, attention maps and both decode graphs come from its own cached call."""
    from keras_attn_serving import Predictor

    from keras_attn.models import generate
    from keras_attn.visualization import attention_maps
    from tests.models.toy_family import ToyDecoderLM

    keras.utils.set_random_seed(5)
    lm = ToyDecoderLM(37, 24)
    prompts = [[4, 8, 15, 16], [23, 2]]
    cached = generate(lm, prompts, 8)
    assert cached == generate(lm, prompts, 8, use_cache=False)
    maps = attention_maps(lm, np.array([[4, 8, 15, 16]], "int32"))
    assert list(maps) == ["block_0", "block_1"] and maps["block_0"]["self"].shape == (1, 4, 4, 4)
    np.testing.assert_allclose(maps["block_1"]["self"].sum(-1), 1.0, atol=1e-5)
    # No `task=`: a model on the cached-call protocol is a generator by itself.
    manifest = export_model(lm, tmp_path / "toy", formats=["onnx"], verbose=False)
    assert manifest["task"] == "generate"
    gqa = manifest["decoding"]["gqa"]
    assert gqa["file"] == "decode_gqa.onnx" and gqa["kv_heads"] == 2
    assert gqa["step_logits_max_abs_diff"] <= 1e-4
    assert Predictor(tmp_path / "toy").generate_ids(prompts, 8) == cached


@pytest.mark.parametrize("model_type, overrides", [
    ("llama", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 8}}),
    ("qwen2", {}),  # biased q, k, v; tied output
])  # fmt: skip
def test_llama_family_exports_both_decode_graphs_equal_to_keras(
    model_type, overrides, tmp_path, monkeypatch
):
    from keras_attn_export import decode_graph
    from keras_attn_serving import ArtifactError, Predictor

    from tests.models import llama_reference as ref

    config, weights = ref.random_checkpoint(model_type, head_dim=16, **overrides)
    ref.write_folder(tmp_path / "hf", config, weights)
    lm = CausalLM.from_pretrained(tmp_path / "hf")
    # Qwen2's decode_gqa.onnx keeps its weights beside it, as models past 64 MiB do.
    external = model_type == "qwen2"
    if external:
        monkeypatch.setattr(decode_graph, "EXTERNAL_DATA_BYTES", 0)
    manifest = export_model(lm, tmp_path / "lm", formats=["onnx"], verbose=False)
    assert all(row["onnx_vs_keras"] <= 1e-4 for row in manifest["parity"]["rows"])
    decoding = manifest["decoding"]
    assert decoding["file"] == "decode.onnx" and decoding["greedy_equals_keras"]
    gqa = decoding["gqa"]  # rotary inside GroupQueryAttention, RMSNorm, SwiGLU
    assert gqa["file"] == "decode_gqa.onnx" and gqa["greedy_equals_keras"], gqa
    assert gqa["step_logits_max_abs_diff"] <= 1e-4 and (gqa["kv_heads"], gqa["key_dim"]) == (2, 16)
    predictor = Predictor(tmp_path / "lm")
    prompts = [[5, 6, 7], [9, 3, 12, 4, 8, 11, 2], [2]]
    expected = lm.generate(prompts, 12)
    assert predictor.generate_ids(prompts, 12) == expected
    assert predictor.generate_ids(prompts, 12, use_cache="decode.onnx") == expected
    if not external:
        assert gqa["external_data"] is None
        return
    assert gqa["external_data"] == "decode_gqa.onnx.data"
    graph = onnx.load(tmp_path / "lm" / "decode_gqa.onnx", load_external_data=False)
    stored = {t.name: {e.key: e.value for e in t.external_data} for t in graph.graph.initializer
              if t.data_location == onnx.TensorProto.EXTERNAL}  # fmt: skip
    kernel = "block_0.qkv.kernel"  # every large tensor is out, 64 KiB-aligned
    assert kernel in stored and all(int(e["offset"]) % 65536 == 0 for e in stored.values())
    # Qwen2 ties its output projection: a Gemm over the embedding table, stored once.
    assert "output_projection" not in {t.name for t in graph.graph.initializer}
    (gemm,) = [n for n in graph.graph.node if n.op_type == "Gemm"]
    assert list(gemm.input)[1] == "token_embedding"
    assert (tmp_path / "lm" / "decode_gqa.onnx").stat().st_size < 65536
    data = tmp_path / "lm" / "decode_gqa.onnx.data"
    assert manifest["files"]["decode_gqa.onnx.data"]
    with open(data, "r+b") as f:  # the weights are hashed like every file
        f.seek(int(stored[kernel]["offset"]))
        f.write(b"\x00\x00\x80\x7f")
    with pytest.raises(ArtifactError, match=r"decode_gqa\.onnx\.data"):
        Predictor(tmp_path / "lm")


def test_rotary_heads_gqa_cannot_rotate_keep_decode_onnx(tmp_path):
    from keras_attn_export.decode_graph import supported

    lm = CausalLM(
        40, 16, hidden_dim=16, num_heads=2, position_encoding="rotary",
        normalization="rms_norm", gated_feed_forward=True, activation="swish",
    )  # fmt: skip
    assert "rotary key_dim 8 is not a multiple of 16" in supported(lm)


def test_generation_format_writes_the_decode_graph_alone_and_serves_it(tmp_path, capsys):
    """formats=["generation"]: no SavedModel, no tf2onnx graph; decode_gqa.onnx written from
    the weights, checked against Keras, and served for generation only."""
    from keras_attn_serving import Predictor
    from keras_attn_serving.predictor import InputError

    keras.utils.set_random_seed(4)
    lm = CausalLM(
        64, 32, hidden_dim=32, num_layers=2, num_heads=2, num_key_value_heads=1,
        position_encoding="rotary", normalization="rms_norm", gated_feed_forward=True,
        activation="swish",
    )  # fmt: skip
    manifest = export_model(lm, tmp_path / "lm", formats=["generation"])
    assert "decode_gqa.onnx: logits within" in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "lm").iterdir()) == [
        "decode_gqa.onnx", "manifest.json"]  # fmt: skip
    assert manifest["onnx"] is None and manifest["saved_model"] is None
    decoding = manifest["decoding"]
    assert decoding["file"] is None and decoding["gqa"]["greedy_equals_keras"]
    assert manifest["parity"]["max_abs_diff"] == decoding["gqa"]["step_logits_max_abs_diff"]
    assert manifest["parity"]["max_abs_diff"] <= 1e-4
    predictor = Predictor(tmp_path / "lm")
    prompts = [[5, 6, 7], [9, 3, 12, 4, 8], [2]]
    assert predictor.generate_ids(prompts, 10) == lm.generate(prompts, 10)
    with pytest.raises(InputError, match="exported for generation only"):
        predictor.run({"token_ids": np.array([[1, 2, 3]], "int32")})
    with pytest.raises(ValueError, match="formats=\\['generation'\\] writes"):
        export_model(lm, tmp_path / "x", formats=["generation", "onnx"], verbose=False)
    classifier = build("classifier_cls")[0]
    with pytest.raises(ValueError, match="this model's task is 'classify'"):
        export_model(classifier, tmp_path / "x", formats=["generation"], verbose=False)
    narrow = CausalLM(40, 16, hidden_dim=16, num_heads=2, position_encoding="rotary")
    with pytest.raises(ValueError, match=r"rotary key_dim 8 .* with formats=\[.onnx.\]"):
        export_model(narrow, tmp_path / "x", formats=["generation"], verbose=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lm"]  # no folder left half-written
