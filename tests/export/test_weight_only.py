"""Weight-only quantized decode graphs (`weights="int4" | "int8"`): onnxruntime's quantizer's
bytes, read back as MatMulNBits reads them, equal to Keras with the same rounded weights;
the manifest's record of the choice and its cost; served with iteration-level batching."""

import copy
import json

import keras
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from keras_attn_export import export_model
from keras_attn_export.cli import main as cli_main
from keras_attn_export.decode_graph import write_decode_graph
from keras_attn_export.weight_only import WeightOnly, quality_ids
from keras_attn_serving.batched_generation import DecodeBatcher
from keras_attn_serving.generation import BoundCache, decode_ids, gqa_step
from onnx import TensorProto, helper, numpy_helper

from keras_attn.models import CausalLM
from tests.helpers import stream_together

pytestmark = pytest.mark.tf_only  # export_model runs under the TensorFlow backend only

LLAMA_LIKE = {"hidden_dim": 64, "num_layers": 2, "num_heads": 4, "num_key_value_heads": 2,
              "position_encoding": "rotary", "normalization": "rms_norm",
              "gated_feed_forward": True, "activation": "swish", "attention_bias": False,
              "feed_forward_bias": False}  # fmt: skip
GPT2_LIKE = {"hidden_dim": 64, "num_layers": 2, "num_heads": 4, "intermediate_dim": 96}
UNTIED = {**GPT2_LIKE, "tie_word_embeddings": False}
# A width that is not whole blocks of 32: the embedding stays a float32 Gather.
NARROW_UNTIED = {**UNTIED, "hidden_dim": 48, "num_heads": 3}


def causal_lm(kwargs, seed=3):
    keras.utils.set_random_seed(seed)
    return CausalLM(80, 48, **kwargs)


def dequantized(kernel, bits, block_size=32):
    """A `(K, N)` kernel as MatMulNBits computes with it after `WeightOnly.quantize`: the
    contrib operator's documented layout (per output column, blocks along K, two 4-bit
    values a byte low nibble first, zero point 2^(bits-1) when none is stored)."""
    kernel = np.asarray(kernel, np.float32)
    packed, scales = WeightOnly(bits, block_size, 1).quantize(kernel)
    n, blocks, _ = packed.shape
    q = packed if bits == 8 else np.stack([packed & 15, packed >> 4], -1)
    values = (q.reshape(n, blocks, block_size).astype(np.float32) - 2 ** (bits - 1)) * scales[
        ..., None
    ]
    return values.reshape(n, -1)[:, : kernel.shape[0]].T


def round_weights(lm, bits):
    """Every weight the quantized graph stores in `bits`, replaced in Keras by its rounded
    value (kernels along their input axis, embedding tables along their width)."""

    def update(variable, to_matrix):
        value = np.asarray(variable)
        variable.assign(dequantized(to_matrix(value), bits).reshape(value.shape))

    for block in lm.decoder_blocks:
        attention, ffn = block.self_attention, block.feed_forward
        for dense in (attention.query_dense, attention.key_dense, attention.value_dense):
            update(dense.kernel, lambda k: k.reshape(k.shape[0], -1))
        update(attention.output_dense.kernel, lambda k: k.reshape(-1, k.shape[-1]))
        for dense in (ffn.intermediate_dense, ffn.output_dense, ffn.gate_dense):
            if dense is not None:
                update(dense.kernel, lambda k: k)
    embedding = lm.token_embedding
    for table in (embedding.embeddings, embedding.reverse_embeddings):
        width = table.shape[-1] if table is not None else 0
        if table is embedding.embeddings and width % 32:
            continue  # gathered in float32 (and, untied, not the output projection)
        if table is not None:  # (vocab, d), quantized along d as the MatMul's K
            value = np.asarray(table)
            table.assign(dequantized(value.T, bits).T)


@pytest.mark.parametrize("bits", [4, 8])
def test_per_weight_quantization_is_onnxruntimes_matmul_nbits_quantizer(bits):
    """The integers and scales written weight by weight are the bytes the whole-model tool
    writes for the same MatMul (K not a multiple of the block included)."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    kernel = np.random.default_rng(0).standard_normal((80, 24)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", 80])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", 24])],
        [numpy_helper.from_array(kernel, "w")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    tool = MatMulNBitsQuantizer(copy.deepcopy(model), bits=bits, block_size=32,
                                is_symmetric=True, accuracy_level=4)  # fmt: skip
    tool.process()
    (node,) = tool.model.model.graph.node
    stored = {t.name: numpy_helper.to_array(t) for t in tool.model.model.graph.initializer}
    assert node.op_type == "MatMulNBits" and len(node.input) == 3  # symmetric: no zero points
    ours = WeightOnly(bits, 32, 4).quantize(kernel)
    for mine, name in zip(ours, node.input[1:], strict=True):
        np.testing.assert_array_equal(mine, stored[name])
    # and the layout `dequantized` reads is the one onnxruntime computes with (float32
    # activations: accuracy level 1)
    (level,) = [a for a in node.attribute if a.name == "accuracy_level"]
    level.i = 1
    session = ort.InferenceSession(tool.model.model.SerializeToString())
    x = np.random.default_rng(1).standard_normal((3, 80)).astype(np.float32)
    y = session.run(None, {"x": x})[0]
    np.testing.assert_allclose(y, x @ dequantized(kernel, bits), atol=1e-4)
    assert np.abs(y - x @ kernel).max() > 0.01  # the rounding shows


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize(
    "kwargs",
    [LLAMA_LIKE, GPT2_LIKE, UNTIED, NARROW_UNTIED],
    ids=["llama_tied_external", "gpt2_tied", "gpt2_untied", "narrow_untied"],
)
def test_quantized_graph_equals_keras_with_its_rounded_weights(tmp_path, kwargs, bits):
    """With float32 activations (accuracy level 1) the quantized graph's logits at every
    position are Keras's once Keras holds the same rounded weights: every quantized tensor
    (projections, embedding and the output projection, tied or not) is laid out right, in
    the graph or in its external-data file (the embedding's scales read twice there)."""
    lm = causal_lm(kwargs)
    external = kwargs is LLAMA_LIKE
    spec = write_decode_graph(lm, tmp_path / "q.onnx", 48, weights=WeightOnly(bits, 32, 1),
                              external_data=external)  # fmt: skip
    assert spec.get("external_data") == ("q.onnx.data" if external else None)
    ops = {node.op_type for node in onnx.load(tmp_path / "q.onnx").graph.node}
    assert "MatMulNBits" in ops and not ops & {"MatMul", "Gemm"}
    gathered = "Gather" if kwargs is NARROW_UNTIED else "GatherBlockQuantized"
    assert gathered in ops
    ids = np.random.default_rng(5).integers(1, 80, size=(1, 12)).astype("int32")
    before = np.asarray(lm(ids))
    round_weights(lm, bits)
    expected = np.asarray(lm(ids))
    session = ort.InferenceSession(str(tmp_path / "q.onnx"))
    step, state = gqa_step(session), BoundCache(session, spec, 1)
    worst = rounding = 0.0
    for t in range(ids.shape[1]):
        logits, state = step(ids[:, t : t + 1], state, t)
        worst = max(worst, float(np.abs(logits - expected[:, t]).max()))
        rounding = max(rounding, float(np.abs(expected[:, t] - before[:, t]).max()))
    assert worst < 1e-4
    assert rounding > 100 * worst  # the rounding moved the logits: the check can fail


def test_weights_argument_writes_scores_and_serves_the_quantized_graph(tmp_path, capsys):
    lm = causal_lm(LLAMA_LIKE)
    manifest = export_model(lm, tmp_path / "lm", formats=["generation"], weights="int4")
    printed = capsys.readouterr().out
    assert "decode_gqa.int4.onnx: top-1 agreement" in printed
    gqa = manifest["decoding"]["gqa"]
    twin = ["prefill_gqa.int4.onnx"] if gqa["weights"]["prefill"] else []  # by measurement
    assert sorted(p.name for p in (tmp_path / "lm").iterdir()) == [
        "decode_gqa.int4.onnx", "manifest.json", *twin]  # fmt: skip
    assert gqa["file"] == "decode_gqa.int4.onnx" and gqa["greedy_equals_keras"]
    weights = gqa["weights"]
    assert (weights["bits"], weights["block_size"], weights["chosen_by"]) == (4, 32, "measurement")
    assert set(weights["candidates"]) == {"1", "4"} and weights["measured_shape"] == [64, 256]
    times = {level: timing["decode_ms"] for level, timing in weights["candidates"].items()}
    assert times[str(weights["accuracy_level"])] == min(times.values())
    quality = weights["quality"]
    assert quality["positions"] == 48 and quality["source"] == "random ids"
    assert 0.0 < quality["max_abs_logit_diff"] < 5.0 and 0.5 <= quality["top1_agreement"] <= 1

    from keras_attn_serving import Predictor

    session = ort.InferenceSession(str(tmp_path / "lm" / "decode_gqa.int4.onnx"))
    prompts = [[5, 6, 7], [9, 3, 12, 4, 8], [2], [7, 7]]
    alone = [
        decode_ids(gqa_step(session), BoundCache(session, gqa, 1), [prompt], 9)[0]
        for prompt in prompts
    ]
    predictor = Predictor(tmp_path / "lm", max_decode_rows=4)  # rows decoded together
    assert predictor.generate_ids(prompts, 9) == alone
    assert alone != lm.generate(prompts, 9)  # int4 rounding changes some of a random model's ids


def _levels(decode, chunk, prompt):
    """Fixed timings for `measure_accuracy_levels`: `{level: ms}` per row count."""
    return {level: {"decode_ms": decode[level], "chunk_64_ms": chunk[level],
                    "prompt_256_ms": prompt[level]} for level in (1, 4)}  # fmt: skip


def _accuracy_levels(path):
    return {a.i for node in onnx.load(path).graph.node if node.op_type == "MatMulNBits"
            for a in node.attribute if a.name == "accuracy_level"}  # fmt: skip


def test_a_prefill_twin_runs_prompts_where_another_level_is_faster(tmp_path, monkeypatch):
    """Where int8 activations (level 4) make a step fastest and float32 ones (level 1) a
    prompt, the export writes the graph again at level 1 beside it, and the server prefills
    runs of `min_tokens` tokens or more with it: at level 1 its logits are Keras's with the
    rounded weights, and what it prefills decodes as it would alone."""
    import keras_attn_export.weight_only as weight_only
    from keras_attn_serving import Predictor
    from keras_attn_serving.generation import PrefillTwin

    timings = _levels({1: 2.0, 4: 1.0}, {1: 3.0, 4: 4.0}, {1: 5.0, 4: 9.0})
    monkeypatch.setattr(weight_only, "measure_accuracy_levels", lambda *a, **k: timings)
    lm = causal_lm(LLAMA_LIKE)
    manifest = export_model(lm, tmp_path / "lm", formats=["generation"], weights="int4",
                            verbose=False)  # fmt: skip
    folder = tmp_path / "lm"
    assert sorted(p.name for p in folder.iterdir()) == [
        "decode_gqa.int4.onnx", "manifest.json", "prefill_gqa.int4.onnx"]  # fmt: skip
    weights = manifest["decoding"]["gqa"]["weights"]
    twin = weights["prefill"]
    assert (weights["accuracy_level"], twin["accuracy_level"], twin["min_tokens"]) == (4, 1, 64)
    assert twin["file"] == "prefill_gqa.int4.onnx"
    assert _accuracy_levels(folder / "decode_gqa.int4.onnx") == {4}
    assert _accuracy_levels(folder / "prefill_gqa.int4.onnx") == {1}
    # Its recorded gap is the twin's over the held-out ids (seeded random ones: no tokenizer).
    held_out = quality_ids(None, 80, 48)[0]
    twin_session = ort.InferenceSession(str(folder / "prefill_gqa.int4.onnx"))
    gqa = manifest["decoding"]["gqa"]
    last, _ = gqa_step(twin_session)(held_out, BoundCache(twin_session, gqa, 1), 0)
    gap = np.abs(last - np.asarray(lm(held_out))[:, -1]).max()
    assert twin["max_abs_logit_diff"] == pytest.approx(gap, rel=1e-4, abs=1e-6)
    # Slower prompts at level 1 even at 256 rows: no twin; faster by less than 10%: none;
    # faster at 256 but not 64: from 256.
    for other in ({1: 9.0, 4: 5.0}, {1: 8.5, 4: 9.0}):
        timed = _levels({1: 2.0, 4: 1.0}, {1: 3.0, 4: 2.0}, other)
        monkeypatch.setattr(weight_only, "measure_accuracy_levels", lambda *a, t=timed, **k: t)
        assert "prefill" not in weight_only.choose("int4", 32, None, (64, 256))[1]
    late = _levels({1: 2.0, 4: 1.0}, {1: 3.0, 4: 2.0}, {1: 5.0, 4: 9.0})
    monkeypatch.setattr(weight_only, "measure_accuracy_levels", lambda *a, **k: late)
    assert weight_only.choose("int4", 32, None, (64, 256))[1]["prefill"] == {
        "accuracy_level": 1, "min_tokens": 256}  # fmt: skip

    # The twin is the quantized graph at level 1: Keras with the rounded weights.
    ids = np.random.default_rng(6).integers(1, 80, size=(1, 20)).astype("int32")
    step_session = ort.InferenceSession(str(folder / "decode_gqa.int4.onnx"))
    round_weights(lm, 4)
    expected = np.asarray(lm(ids))[:, -1]
    runs = {"twin": 0}
    run = twin_session.run_with_iobinding

    def counted(binding):
        runs["twin"] += 1
        return run(binding)

    twin_session.run_with_iobinding = counted
    cache = BoundCache(step_session, gqa, 1, PrefillTwin(twin_session, 8))
    logits, _ = gqa_step(step_session)(ids, cache, 0)
    assert runs["twin"] == 1 and np.abs(logits - expected).max() < 1e-4
    short = BoundCache(step_session, gqa, 1, PrefillTwin(twin_session, 8))
    gqa_step(step_session)(ids[:, :7], short, 0)  # 7 tokens: the step graph's
    assert runs["twin"] == 1

    # Served: the predictor loads the twin; the shared loop prefills through it (every run
    # here is >= 8 tokens), and each stream decodes as its prompt does alone.
    predictor = Predictor(folder, max_decode_rows=4)
    assert predictor.prefill_twin is not None and predictor.prefill_twin.min_tokens == 64
    prompts = np.random.default_rng(7).integers(1, 80, size=(4, 20)).tolist()
    prompts[1] = prompts[1][:12]
    alone = [
        decode_ids(gqa_step(step_session), BoundCache(step_session, gqa, 1,
                                                      PrefillTwin(twin_session, 8)), [p], 9)[0]
        for p in prompts
    ]  # fmt: skip
    runs["twin"] = 0
    batcher = DecodeBatcher(step_session, gqa, None, 4, prefill=PrefillTwin(twin_session, 8))
    together = stream_together(batcher, [(p, 9) for p in prompts])
    batcher.close()
    assert together == alone and runs["twin"] >= 1


def test_a_prefill_twin_is_checked_at_export_and_when_served(tmp_path, monkeypatch):
    """At export, a twin further from the float model than the decode graph allows is not
    kept; served, a twin named outside the folder, or one that does not take and give what
    the decode graph does, is refused by name, hashes checked or not."""
    import shutil

    import keras_attn_export.weight_only as weight_only
    import keras_attn_export.weight_only_graphs as graphs
    from keras_attn_serving import Predictor
    from keras_attn_serving.manifest import ArtifactError

    timings = _levels({1: 2.0, 4: 1.0}, {1: 3.0, 4: 4.0}, {1: 5.0, 4: 9.0})
    monkeypatch.setattr(weight_only, "measure_accuracy_levels", lambda *a, **k: timings)
    lm = causal_lm(LLAMA_LIKE)
    monkeypatch.setattr(graphs, "TWIN_SLACK", 0.0)  # no gap passes
    manifest = export_model(lm, tmp_path / "strict", formats=["generation"], weights="int4",
                            verbose=False)  # fmt: skip
    assert "prefill" not in manifest["decoding"]["gqa"]["weights"]
    assert not (tmp_path / "strict" / "prefill_gqa.int4.onnx").exists()
    monkeypatch.setattr(graphs, "TWIN_SLACK", 1.5)
    export_model(lm, tmp_path / "lm", formats=["generation"], weights="int4", verbose=False)

    outside = tmp_path / "outside"
    shutil.copytree(tmp_path / "lm", outside)
    path = outside / "manifest.json"
    content = json.loads(path.read_text())
    content["decoding"]["gqa"]["weights"]["prefill"]["file"] = "../lm/prefill_gqa.int4.onnx"
    path.write_text(json.dumps(content))
    with pytest.raises(ArtifactError, match=r"'\.\./lm/prefill_gqa\.int4\.onnx': not a plain name"):
        Predictor(outside, verify=False)

    renamed = tmp_path / "renamed"
    shutil.copytree(tmp_path / "lm", renamed)
    twin = onnx.load(renamed / "prefill_gqa.int4.onnx")
    for node in twin.graph.node:
        node.output[:] = ["other" if o == "logits" else o for o in node.output]
    twin.graph.output[0].name = "other"
    onnx.save(twin, renamed / "prefill_gqa.int4.onnx")
    with pytest.raises(ArtifactError, match=r"prefill\.file: its inputs and outputs are not"):
        Predictor(renamed, verify=False)
    with pytest.raises(ArtifactError, match="sha256"):
        Predictor(renamed)


def test_beam_search_runs_over_a_quantized_graph_as_keras_with_its_rounded_weights(tmp_path):
    """An artifact of a weight-only graph alone (no `decode.onnx`) serves beam search over
    it: at level 1, Keras `generate(sampler="beam")` with the rounded weights, ids for ids."""
    from keras_attn_serving import Predictor
    from keras_attn_serving.generation_request import Beams

    from keras_attn.models import generate

    lm = causal_lm(LLAMA_LIKE)
    export_model(lm, tmp_path / "lm", formats=["generation"], weights="int4",
                 weights_accuracy_level=1, verbose=False)  # fmt: skip
    round_weights(lm, 4)
    predictor = Predictor(tmp_path / "lm")
    assert predictor.decode_session is None
    for prompt, settings in (([5, 6, 7], {"num_beams": 3}),
                             ([9, 3, 12, 4, 8], {"num_beams": 4, "length_penalty": 2.0}),
                             ([2], {"num_beams": 2, "no_repeat_ngram_size": 2})):  # fmt: skip
        beams = Beams(**{"length_penalty": 1.0, "early_stopping": False,
                         "no_repeat_ngram_size": 0, **settings})  # fmt: skip
        (expected,) = generate(lm, [prompt], 10, sampler="beam", **settings)
        assert predictor.beam_ids(prompt, 10, (), beams) == expected, settings


def test_weight_arguments_are_checked_by_name(tmp_path):
    lm = causal_lm(LLAMA_LIKE)
    for kwargs, message in (
        ({"weights": "int3"}, "one of .* Received: weights='int3'"),
        ({"weights": "int4", "weights_block_size": 24}, "power of two.*weights_block_size=24"),
        ({"weights": "int4", "weights_block_size": True}, "weights_block_size=True"),
        ({"weights": "int4", "weights_block_size": 128}, r"wider than the model \(64\)"),
        ({"weights": "int4", "weights_accuracy_level": 2}, "weights_accuracy_level=2"),
        ({"weights": "int4", "weights_accuracy_level": 1.0}, "weights_accuracy_level=1.0"),
        ({"weights": "int4", "weights_accuracy_level": True}, "weights_accuracy_level=True"),
        ({"weights_accuracy_level": 4}, "applies to int8 or int4 `weights`"),
        ({"weights": "int4", "formats": ["saved_model"]}, "needs a causal LM"),
    ):
        with pytest.raises(ValueError, match=message):
            export_model(lm, tmp_path / "x", verbose=False, **kwargs)
    narrow = CausalLM(40, 16, hidden_dim=16, num_heads=2, position_encoding="rotary")
    with pytest.raises(ValueError, match=r"cannot express this model: .*rotary key_dim 8"):
        export_model(narrow, tmp_path / "x", formats=["onnx"], weights="int4",
                     weights_block_size=16)  # fmt: skip
    classifier = keras.Sequential([keras.Input((4,), dtype="int32"), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match="this model's task is None"):
        export_model(classifier, tmp_path / "x", weights="int8", formats=["onnx"])
    assert not (tmp_path / "x").exists()


def test_held_out_ids_come_from_the_tokenizer_when_there_is_one():
    class Letters:
        def tokenize(self, text):
            return np.array([ord(c) % 50 for c in text], "int32")

    ids, source = quality_ids(Letters(), 80, 48)
    assert source == "held-out text" and ids.shape == (1, 48) and ids[0, 0] == ord("T") % 50
    ids, source = quality_ids(Letters(), 40, 48)  # ids past the vocabulary: random ones
    assert source == "random ids" and ids.max() < 40
    assert quality_ids(None, 80, 16)[0].shape == (1, 16)


def test_cli_writes_int8_weights_at_the_given_accuracy_level(tmp_path):
    lm = causal_lm(UNTIED)
    lm.save(tmp_path / "lm.keras")
    out = tmp_path / "out"
    args = [str(tmp_path / "lm.keras"), str(out), "--formats", "generation", "--weights",
            "int8", "--weights-accuracy-level", "1", "--weights-block-size", "64",
            "--max-length", "24"]  # fmt: skip
    assert cli_main(args) == 0
    gqa = json.loads((out / "manifest.json").read_text())["decoding"]["gqa"]
    assert gqa["max_length"] == 24
    weights = gqa["weights"]
    assert (weights["type"], weights["accuracy_level"], weights["block_size"]) == ("int8", 1, 64)
    assert weights["chosen_by"] == "argument" and weights["candidates"] == {}
    assert weights["quality"]["top1_agreement"] >= 0.9


def test_cli_exports_a_causal_lm_folder_as_its_decode_graph_by_default(tmp_path):
    """A Hugging Face causal LM folder without `--formats`: the decode graph from its
    weights, not a SavedModel traced through tf2onnx (out of memory at real sizes)."""
    causal_lm(GPT2_LIKE).save_pretrained(tmp_path / "folder")
    out = tmp_path / "out"
    assert cli_main([str(tmp_path / "folder"), str(out), "--max-length", "24"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["onnx"] is None and manifest["saved_model"] is None
    assert list(manifest["files"]) == ["decode_gqa.onnx"]
    assert manifest["decoding"]["gqa"]["max_length"] == 24
    # Options of the ONNX file keep the formats they have always had.
    assert cli_main([str(tmp_path / "folder"), str(out), "--optimize"]) == 0
    assert json.loads((out / "manifest.json").read_text())["onnx"]["file"] == "model.opt.onnx"


def test_max_length_sizes_the_cache_and_is_checked(tmp_path):
    """`max_length` below the model's positions: the cache and rotary tables hold that many,
    generation within it equals Keras's, and a prompt past it is refused."""
    from keras_attn_serving import Predictor
    from keras_attn_serving.predictor import InputError

    lm = causal_lm(LLAMA_LIKE)  # 48 positions
    manifest = export_model(lm, tmp_path / "lm", formats=["generation"], max_length=16,
                            verbose=False)  # fmt: skip
    assert manifest["decoding"]["gqa"]["max_length"] == 16
    graph = onnx.load(tmp_path / "lm" / "decode_gqa.onnx")
    (cos,) = [t for t in graph.graph.initializer if t.name == "rotary_cos"]
    assert list(cos.dims) == [16, 8]
    predictor = Predictor(tmp_path / "lm")
    prompts = [[5, 6, 7], [9, 3, 12, 4, 8]]
    assert predictor.generate_ids(prompts, 8) == lm.generate(prompts, 8)
    with pytest.raises((InputError, ValueError), match="16"):
        predictor.generate_ids([list(range(1, 15))], 8)
    for bad in (100, 4, True, 16.0):
        with pytest.raises(
            ValueError, match=f"the model's 48 positions. Received: max_length={bad!r}"
        ):
            export_model(lm, tmp_path / "x", formats=["generation"], max_length=bad)
    classifier = keras.Sequential([keras.Input((4,), dtype="int32"), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match=r"this model has none\. Received: max_length=16"):
        export_model(classifier, tmp_path / "x", formats=["onnx"], max_length=16)


@pytest.mark.parametrize("block_size", [128, -1], ids=["blocks_with_zero_points", "per_column"])
def test_a_model_quantized_to_int4_in_keras_exports_to_the_same_operators(tmp_path, block_size):
    """`model.quantize("int4")` (Keras's blocks of 128 rows with zero points, or one scale a
    column): the decode graph holds Keras's own int4 numbers as MatMulNBits and gives
    Keras's logits at every step (float32 activations)."""
    from keras.quantizers import Int4QuantizationConfig

    lm = causal_lm({**LLAMA_LIKE, "num_layers": 1})  # feed-forward output: K = 256, 2 blocks
    lm.quantize("int4", config=Int4QuantizationConfig(block_size=block_size))
    manifest = export_model(lm, tmp_path / "lm", formats=["generation"], verbose=False)
    assert manifest["decoding"]["gqa"]["step_logits_max_abs_diff"] < 1e-4
    nodes = onnx.load(tmp_path / "lm" / "decode_gqa.onnx").graph.node
    nbits = [node for node in nodes if node.op_type == "MatMulNBits"]
    assert len(nbits) == 5 and not [
        node for node in nodes if node.op_type == "MatMul"
    ]  # qkv, o, 3 ffn
    assert {len(node.input) for node in nbits} == ({4} if block_size == 128 else {3})
    odd = causal_lm({**LLAMA_LIKE, "num_layers": 1})
    odd.quantize("int4", config=Int4QuantizationConfig(block_size=48))
    from keras_attn_export.decode_graph import supported

    assert "int4 block size 48 is not a power of two" in supported(odd)
