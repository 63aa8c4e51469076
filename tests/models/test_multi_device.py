"""The same training script on more than one device: TensorFlow's MultiWorkerMirroredStrategy
with two worker processes (TF_CONFIG on loopback), and the Keras distribution API
(DataParallel) on JAX with two host devices. Each ends with the weights of the one-device run
at the same global batch; the two TensorFlow workers end identical."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPT = str(Path(__file__).resolve().parents[2] / "examples" / "train_multi_device.py")


def start(folder, name, *flags, env=None):
    command = [sys.executable, SCRIPT, "--steps", "6", "--out", f"{folder}/{name}.json",
               "--weights-out", f"{folder}/{name}.npy", *flags]  # fmt: skip
    return subprocess.Popen(command, env={**os.environ, **(env or {})}, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip


def finish(process):
    out, err = process.communicate(timeout=600)
    assert process.returncode == 0, err[-3000:]
    return out


@pytest.mark.slow
@pytest.mark.tf_only
def test_multi_worker_mirrored_strategy_on_two_local_workers(tmp_path):
    runs = [start(tmp_path, "one"), start(tmp_path, "two", "--workers", "2")]
    for run in runs:
        finish(run)
    workers = json.loads((tmp_path / "two.json").read_text())
    assert [w["setup"] for w in workers] == ["MultiWorkerMirroredStrategy, 2 workers"] * 2
    first, second = np.load(tmp_path / "two.0.npy"), np.load(tmp_path / "two.1.npy")
    alone = np.load(tmp_path / "one.npy")
    assert np.array_equal(first, second)  # synchronous: the workers never drift apart
    difference = np.abs(first - alone).max()
    assert difference <= 1e-5, difference  # half the global batch each, gradients all-reduced


@pytest.mark.slow
def test_keras_data_parallel_on_two_jax_host_devices(tmp_path):
    jax = {"KERAS_BACKEND": "jax"}
    two = {**jax, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    runs = [start(tmp_path, "one", env=jax), start(tmp_path, "two", "--data-parallel", env=two)]
    for run in runs:
        finish(run)
    result = json.loads((tmp_path / "two.json").read_text())
    assert result["setup"] == "DataParallel over 2 jax devices" and result["replicas"] == 2
    difference = np.abs(np.load(tmp_path / "two.npy") - np.load(tmp_path / "one.npy")).max()
    assert difference <= 1e-5, difference
