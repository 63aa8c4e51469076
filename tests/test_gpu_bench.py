"""`bench/gpu_train.py`, the script a lent GPU machine runs (`bench/gpu.sh`), at its tiny
CPU size: it trains every model it can build, counts FLOPs the PaLM way and reports MFU."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_gpu_training_bench_runs_tiny_on_a_cpu(tmp_path):
    out = tmp_path / "gpu_train.json"
    env = {**os.environ, "KERAS_BACKEND": "jax", "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run(
        [sys.executable, "bench/gpu_train.py", "--tiny", "--rounds", "1",
         "--models", "ours,plain keras", "--out", str(out)],
        capture_output=True, text=True, timeout=600, check=False, cwd=ROOT, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    # 6 x (2 layers x (4 x 64² + 2 x 64 x 256) + 64 x 512) + 12 x 2 x 64 x 64
    assert result["flops_per_token"] == 884_736
    assert set(result["rows"]) == {"ours", "plain keras"}
    for row in result["rows"].values():
        assert row["tokens_per_s"] > 0 and 0 < row["mfu_measured_peak"] < 1
        assert row["fused_attention"] is False  # XLA's own attention on a CPU, not cuDNN's
    assert result["platform"] == "cpu" and result["datasheet_peak_flops"] is None
