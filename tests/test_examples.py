"""Each example runs a short version of itself; README code blocks run as written.

Each example runs in a process of its own (`run_example`): run one after another in a pytest
worker, they left that worker's memory growing (14.5 GB and the OOM killer on a 24 GB
machine), and a process's memory all returns when it ends."""

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
# A deadlock net, not a speed bound: a busy 2-core machine takes minutes for some.
EXAMPLE_TIMEOUT_S = 1800


def run_example(name, args):
    """`examples.<name>.main(args)` in a new interpreter; what it returned (JSON)."""
    code = (
        "import json, sys\n"
        f"from examples import {name}\n"
        f"result = {name}.main({list(args)!r})\n"
        "print('RESULT ' + json.dumps(result, default=float))\n"
    )
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", code], capture_output=True, text=True,
        timeout=EXAMPLE_TIMEOUT_S, check=False, cwd=ROOT, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    return json.loads(line[len("RESULT ") :])


@pytest.mark.slow
def test_quickstart_learns_the_pattern():
    accuracy = run_example("quickstart", ["--epochs", "2", "--samples", "2000"])
    assert accuracy > 0.9  # a trained model, not an untrained one (~1/23 by chance)


@pytest.mark.slow
@pytest.mark.tf_only
def test_main_job_toy_pipeline(tmp_path):
    """The README's main job at toy size: train, export, onnxruntime parity, generation,
    and the int8 / int4 decode graphs' perplexity beside float32's."""
    summary = run_example(
        "shakespeare_lm",
        ["--minutes", "0.02", "--max-documents", "2", "--vocabulary-size", "400",
         "--vocabulary-lines", "3000", "--hidden-dim", "32", "--num-layers", "1",
         "--num-heads", "2", "--sequence-length", "16", "--batch-size", "16",
         "--new-tokens", "4", "--scored-windows", "8", "--out", str(tmp_path / "lm")]
    )  # fmt: skip
    assert summary["parity_max_abs_diff"] <= 1e-4
    assert summary["decoding_step_max_abs_diff"] <= 1e-4
    assert 1.0 < summary["held_out_perplexity"] < 400  # trained at least a little
    assert summary["sample"].startswith("to be or not to be")
    assert (tmp_path / "lm" / "model.onnx").is_file() and (tmp_path / "lm.keras").is_file()
    costs = summary["weights"]
    # The float32 graph's perplexity, computed step by step, is Keras's on the same windows.
    assert costs["float32"]["perplexity"] == pytest.approx(costs["float32"]["keras_perplexity"],
                                                           rel=1e-4)  # fmt: skip
    for kind, bound in (("int8", 1.02), ("int4", 1.25)):
        ratio = costs[kind]["perplexity"] / costs["float32"]["perplexity"]
        assert 1 / bound < ratio < bound, (kind, ratio)
        assert (tmp_path / f"lm_{kind}" / f"decode_gqa.{kind}.onnx").is_file()
    assert costs["int4"]["file_bytes"] < costs["int8"]["file_bytes"]


@pytest.mark.slow
def test_readme_python_blocks_run():
    """As a user runs them: each block in a new interpreter (faulthandler on, so a crash
    shows where), printing what the README says it prints."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert blocks, "README should show the library in use"
    printed = []
    for block in blocks:
        done = subprocess.run(
            [sys.executable, "-X", "faulthandler", "-c", block],
            capture_output=True, text=True, timeout=EXAMPLE_TIMEOUT_S, check=False, cwd=ROOT,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        printed += done.stdout.splitlines()
    assert "(1, 5, 64)" in printed and "(1, 3)" in printed, printed
    assert float(printed[-1]) <= 1e-4  # the README ends on the export parity figure


# Each example at toy size: it runs end to end and reports its metric in range. The figures
# the full runs reach are in the README.
SHORT_RUNS = {
    "ab_task": ["--samples", "600", "--epochs", "2", "--length", "12"],
    "dates_seq2seq": ["--train", "256", "--test", "4", "--epochs", "1", "--hidden-dim", "32"],
    "dates_lstm_attention": ["--train", "256", "--test", "4", "--epochs", "1"],
    "qa_and_choice": ["--train", "64", "--test", "16", "--epochs", "1"],
    "ner": ["--max-train", "64", "--epochs", "1", "--vocabulary-size", "400"],
    "sentiment": ["--max-train", "256", "--max-test", "64", "--epochs", "1"],
    "semantic_search": ["--corpus-size", "40", "--top-k", "1"],
    "fill_mask": ["--lines", "256", "--epochs", "1", "--sequence-length", "16"],
    "pretrain_finetune": ["--max-pretrain", "256", "--labeled", "64", "--max-test", "64",
                          "--pretrain-epochs", "1", "--finetune-epochs", "1"],
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.tf_only
def test_sentiment_lora_trains_a_small_share_of_minilm():
    args = ["--pretrained", "--lora", "4", "--max-train", "64", "--max-test", "32",
            "--epochs", "1", "--sequence-length", "16"]  # fmt: skip
    lora = run_example("sentiment", args)
    # MiniLM: 22.7M frozen; 12 adapters A (384, 12, 4), B (4, 32) (Keras EinsumDense LoRA) + head
    assert 0.9 < lora["trainable_percent"] < 1.0  # 223,875 of 22,937,091
    assert 0.0 <= lora["accuracy"] <= 1.0


@pytest.mark.slow
@pytest.mark.tf_only
@pytest.mark.parametrize("name", sorted(SHORT_RUNS))
def test_example_runs_a_few_steps(name):
    results = run_example(name, SHORT_RUNS[name])
    values = [v for r in results.values() for v in (r.values() if isinstance(r, dict) else [r])]
    assert values and all(0.0 <= v <= 100.0 for v in values), results


@pytest.mark.slow
@pytest.mark.tf_only
def test_t5_dates_example_fine_tunes_evaluates_exports_and_serves_beams(tmp_path):
    args = ["--train", "256", "--test", "4", "--epochs", "1", "--hidden-dim", "32",
            "--out", str(tmp_path)]  # fmt: skip
    results = run_example("t5_dates", args)
    for decoding in ("greedy", "beam"):
        assert set(results[decoding]) == {"exact_match", "bleu", "meteor", "wer", "bertscore_f1"}
        assert all(0.0 <= v <= 100.0 for v in results[decoding].values()), results
    assert results["served"]["served_equals_keras"] == 1.0
    assert results["served"]["step_logits_max_abs_diff"] <= 1e-4
    config = json.loads((tmp_path / "t5-dates" / "config.json").read_text())
    assert config["model_type"] == "t5" and config["feed_forward_proj"] == "gated-gelu"


@pytest.mark.slow
@pytest.mark.tf_only
def test_gpt2_folder_example_serves_the_ids_keras_samples(tmp_path):
    args = ["--seconds", "5", "--lines", "2000", "--new-tokens", "8", "--out", str(tmp_path)]
    results = run_example("gpt2_folder_generate", args)
    assert results["served_equals_keras"] == 1.0 and results["new_tokens"] == 8
    assert results["parity_max_abs_diff"] <= 1e-4
    assert sorted(p.name for p in (tmp_path / "toy-gpt2").iterdir()) == [
        "config.json", "merges.txt", "model.safetensors", "vocab.json"]  # fmt: skip


@pytest.mark.slow
@pytest.mark.tf_only
def test_llama_lora_example_trains_adapters_and_serves_the_merged_export(tmp_path):
    args = ["--seconds", "5", "--lines", "2000", "--new-tokens", "6", "--out", str(tmp_path)]
    results = run_example("llama_lora_shakespeare", args)
    assert 0.5 < results["trainable_percent"] < 5.0  # query and value adapters only
    assert results["loss_after"] < results["loss_before"]
    assert results["parity_max_abs_diff"] <= 1e-4 and results["served_equals_keras"] == 1.0
    assert (tmp_path / "adapter.safetensors").stat().st_size < 100_000
