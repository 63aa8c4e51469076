"""The same training script on more than one device: TensorFlow's MultiWorkerMirroredStrategy
with two worker processes (TF_CONFIG on loopback), and the Keras distribution API on JAX:
DataParallel over two host devices, DataParallel over two JAX processes (jax.distributed on
loopback, CPU collectives), and ModelParallel with the backbone's layout map over a 2 x 2 mesh
of four host devices. Each ends with the weights of the one-device run at the same global
batch; the two TensorFlow workers (and the two JAX processes) end identical."""

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


# The JAX runs below are subprocesses with their own KERAS_BACKEND: run once, in the
# TensorFlow pass of `make test` (tf_only), not again in the torch pass.
@pytest.mark.slow
@pytest.mark.tf_only
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


@pytest.mark.slow
@pytest.mark.tf_only
def test_keras_model_parallel_with_the_backbone_layout_map(tmp_path):
    jax = {"KERAS_BACKEND": "jax"}
    four = {**jax, "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    runs = [start(tmp_path, "one", env=jax),
            start(tmp_path, "mp", "--model-parallel", "2", env=four)]  # fmt: skip
    for run in runs:
        finish(run)
    result = json.loads((tmp_path / "mp.json").read_text())
    assert result["setup"] == "ModelParallel over a 2x2 jax mesh (batch, model)"
    # Each block's q/k/v, attention output and feed-forward kernels, and the embeddings, are
    # sharded over "model"; nothing else is.
    sharded = result["sharded_over_model"]
    for block in (0, 1):
        for name in ("query", "key", "value", "attention_output"):
            assert f"decoder_block_{block}/self_attention/{name}/kernel" in sharded, sharded
        for name in ("intermediate", "output"):
            assert f"decoder_block_{block}/feed_forward/{name}/kernel" in sharded, sharded
    assert not [p for p in sharded if "bias" in p or "norm" in p]
    difference = np.abs(np.load(tmp_path / "mp.npy") - np.load(tmp_path / "one.npy")).max()
    assert difference <= 1e-5, difference


@pytest.mark.slow
@pytest.mark.tf_only
def test_keras_data_parallel_over_two_jax_processes(tmp_path):
    jax = {"KERAS_BACKEND": "jax"}
    runs = [start(tmp_path, "one", env=jax),
            start(tmp_path, "procs", "--jax-processes", "2", env=jax)]  # fmt: skip
    for run in runs:
        finish(run)
    processes = json.loads((tmp_path / "procs.json").read_text())
    assert [p["setup"] for p in processes] == ["DataParallel over 2 jax processes"] * 2
    assert [p["replicas"] for p in processes] == [2, 2]
    first, second = np.load(tmp_path / "procs.0.npy"), np.load(tmp_path / "procs.1.npy")
    assert np.array_equal(first, second)
    difference = np.abs(first - np.load(tmp_path / "one.npy")).max()
    assert difference <= 1e-5, difference
