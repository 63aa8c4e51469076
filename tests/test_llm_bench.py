"""`bench/llm_cpu.py` (issue 44's decoders against llama.cpp and onnxruntime-genai) at its tiny
shape: the folder it writes loads in `transformers` as the same model, our systems export,
time and serve, and a peer that is not installed is named and left out, not fatal."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_llm_bench_runs_tiny_with_the_peers_it_has(tmp_path):
    out = tmp_path / "llm_cpu.json"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run(
        [sys.executable, "bench/llm_cpu.py", "--shapes", "tiny", "--systems", "int4",
         "served-int4", "genai-int4", "--rounds", "1", "--seconds", "2", "--json", str(out)],
        capture_output=True, text=True, timeout=900, check=False, cwd=ROOT, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    try:
        import onnxruntime_genai  # noqa: F401

        peers = ["genai-int4"]
    except ImportError:
        peers = []
        assert "genai not compared: No module named 'onnxruntime_genai'" in done.stdout
    assert report["systems"] == ["int4", "served-int4", *peers]
    (only,) = report["shapes"]["tiny"]["rounds"]
    rows = only["rows"]
    assert rows["int4"]["quality"]["type"] == "int4"
    assert rows["int4"]["quality"]["accuracy_level"] in (1, 4)
    for key in ("prefill_tok_s", "decode_1_tok_s", "decode_32_tok_s"):
        assert rows["int4"][key] > 0
    assert rows["served-int4"]["served_tok_s"] > 0 and rows["served-int4"]["errors"] == 0
    # The served run's ceiling: a request's 128 ids are 1/8 of an admitting run (the first id)
    # and 127 steps of 32 rows.
    ceiling = 128e3 / (127 * rows["int4"]["step_32_ms"] / 32 + rows["int4"]["admit_ms"] / 8)
    assert rows["served-int4"]["served_ceiling_tok_s"] == pytest.approx(ceiling)
    assert only["goals"]["served_32_vs_ceiling"] == pytest.approx(
        rows["served-int4"]["served_tok_s"] / ceiling
    )
    assert only["goals"]["decode_1_vs_llama_q4_0"] is None
    assert (only["goals"]["decode_1_vs_genai_int4"] is None) == (not peers)
    for system in ["int4", *peers]:  # a step reads every stored byte at most at read bandwidth
        row = rows[system]
        assert row["bandwidth_limit_tok_s"] == pytest.approx(
            report["machine"]["read_gb_s"] * 1e9 / row["file_bytes"]
        )


@pytest.mark.slow
def test_the_bench_folder_is_the_model_transformers_computes(tmp_path):
    """The peers convert the folder `write_folder` makes, so it must be a Llama that
    `transformers` reads as ours: the same logits from the same ids."""
    import keras
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    saved = list(sys.path)  # the bench's imports edit sys.path
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import llm_cpu
    finally:
        sys.path[:] = saved
    from keras_attn.models import CausalLM

    folder = tmp_path / "tiny"
    params = llm_cpu.write_folder("tiny", folder)
    reference = AutoModelForCausalLM.from_pretrained(folder).eval()
    assert params == sum(p.numel() for p in reference.parameters())
    assert len(AutoTokenizer.from_pretrained(folder)("To be, or not to be")["input_ids"]) > 3
    ids = np.random.default_rng(0).integers(1, 2048, (2, 12))
    with torch.no_grad():
        expected = reference(torch.tensor(ids)).logits.numpy()
    got = keras.ops.convert_to_numpy(CausalLM.from_pretrained(folder)(ids))
    np.testing.assert_allclose(got, expected, atol=1e-4)
