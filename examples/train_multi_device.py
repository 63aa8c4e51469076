"""Training one model on more than one device, with the engines TensorFlow and JAX already have.

    # One device: the baseline.
    python examples/train_multi_device.py
    # TensorFlow: MultiWorkerMirroredStrategy, two worker processes on this machine (TF_CONFIG
    # on loopback; this script starts them and prints both).
    python examples/train_multi_device.py --workers 2
    # JAX: the Keras distribution API (DataParallel) over two host devices.
    XLA_FLAGS=--xla_force_host_platform_device_count=2 KERAS_BACKEND=jax \\
        python examples/train_multi_device.py --data-parallel
    # JAX: ModelParallel over four host devices, a 2 x 2 mesh ("batch", "model"): the
    # backbone's `get_layout_map` shards attention and feed-forward kernels over "model".
    XLA_FLAGS=--xla_force_host_platform_device_count=4 KERAS_BACKEND=jax \\
        python examples/train_multi_device.py --model-parallel 2
    # JAX: two processes (jax.distributed on loopback, CPU collectives), DataParallel over
    # their devices, each process feeding its half of every global batch.
    KERAS_BACKEND=jax python examples/train_multi_device.py --jax-processes 2

The model is a small `CausalLM` (vocabulary 512, 64 positions, width 64, 2 blocks, 4 heads);
the data are generated token windows with a learnable rule. Every run uses the same global
batch, so the runs compute the same updates: the script prints the loss, tokens per second
(the first step, which compiles, excluded) and a checksum of the final weights; `--out FILE`
writes them as JSON.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=1, help="TensorFlow worker processes")
    p.add_argument("--worker-index", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--data-parallel", action="store_true", help="JAX: DataParallel over devices")
    p.add_argument("--model-parallel", type=int, default=None, metavar="N",
                   help="JAX: ModelParallel, the model axis N devices wide")  # fmt: skip
    p.add_argument("--jax-processes", type=int, default=1, help="JAX processes (loopback)")
    p.add_argument("--process-id", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--coordinator", default=None, help=argparse.SUPPRESS)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--global-batch", type=int, default=32)
    p.add_argument("--out", default=None, help="write the results here as JSON")
    p.add_argument("--weights-out", default=None, help="save the final weights (.npy)")
    args = p.parse_args(argv)
    if args.workers < 1 or args.global_batch % args.workers:
        p.error("--global-batch must be a multiple of --workers (>= 1)")
    if args.jax_processes < 1 or args.global_batch % args.jax_processes:
        p.error("--global-batch must be a multiple of --jax-processes (>= 1)")
    chosen = [flag for flag, on in (("--workers", args.workers > 1),
                                    ("--data-parallel", args.data_parallel),
                                    ("--model-parallel", args.model_parallel),
                                    ("--jax-processes", args.jax_processes > 1)) if on]  # fmt: skip
    if len(chosen) > 1:
        p.error(f"choose one way to use several devices; received {' and '.join(chosen)}")
    return args


def data(steps, global_batch, length=65, vocabulary=512):
    import numpy as np

    rng = np.random.default_rng(0)
    ids = rng.integers(1, vocabulary, (steps * global_batch, length)).astype("int32")
    ids[:, 1::2] = ids[:, ::2][:, : ids[:, 1::2].shape[1]] % (vocabulary - 1) + 1  # learnable
    return ids[:, :-1], ids[:, 1:]


def train(args):
    """Trains under the strategy or distribution the arguments ask for; returns the results."""
    import keras
    import numpy as np

    from keras_attn.models import CausalLM

    if args.process_id is not None:  # before anything touches a JAX device
        keras.distribution.initialize(args.coordinator, args.jax_processes, args.process_id)
    keras.utils.set_random_seed(0)
    x, y = data(args.steps, args.global_batch)
    backend = keras.backend.backend()
    if (args.model_parallel or args.jax_processes > 1) and backend != "jax":
        raise SystemExit("--model-parallel and --jax-processes use JAX: KERAS_BACKEND=jax")
    batch_size = args.global_batch
    if args.process_id is not None:  # one of --jax-processes: the global devices are all theirs
        devices = keras.distribution.list_devices()
        # This script gives each process its own rows (below), so Keras must not shard again.
        keras.distribution.set_distribution(
            keras.distribution.DataParallel(devices=devices, auto_shard_dataset=False)
        )
        setup, replicas = f"DataParallel over {args.jax_processes} jax processes", len(devices)
        # Each process feeds its own rows of every global batch, in step order.
        share = args.global_batch // args.jax_processes
        rows = np.arange(len(x)).reshape(args.steps, args.jax_processes, share)
        x, y = x[rows[:, args.process_id].ravel()], y[rows[:, args.process_id].ravel()]
        batch_size = share
    if args.model_parallel:
        from keras_attn.models import DecoderBackbone

        devices = keras.distribution.list_devices()
        if len(devices) % args.model_parallel:
            raise SystemExit(f"--model-parallel {args.model_parallel}: {len(devices)} devices")
        mesh = keras.distribution.DeviceMesh(
            (len(devices) // args.model_parallel, args.model_parallel), ["batch", "model"], devices
        )
        layout_map = DecoderBackbone.get_layout_map(mesh)
        keras.distribution.set_distribution(
            keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch")
        )
        setup = f"ModelParallel over a {mesh.shape[0]}x{mesh.shape[1]} jax mesh (batch, model)"
        replicas = len(devices)
    if args.data_parallel:
        if backend != "jax":
            raise SystemExit("--data-parallel is the Keras distribution API: KERAS_BACKEND=jax")
        devices = keras.distribution.list_devices()
        keras.distribution.set_distribution(keras.distribution.DataParallel(devices=devices))
        setup, replicas = f"DataParallel over {len(devices)} {backend} devices", len(devices)
    if backend == "tensorflow":
        import tensorflow as tf

        strategy = (tf.distribute.MultiWorkerMirroredStrategy() if args.worker_index is not None
                    else tf.distribute.get_strategy())  # fmt: skip
        replicas = strategy.num_replicas_in_sync
        setup = (f"MultiWorkerMirroredStrategy, {replicas} workers"
                 if args.worker_index is not None else "one device")  # fmt: skip
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(args.global_batch)
        scope = strategy.scope()
    else:
        import contextlib

        dataset, scope = None, contextlib.nullcontext()
        if not (args.data_parallel or args.model_parallel or args.process_id is not None):
            setup, replicas = "one device", 1
    with scope:
        model = CausalLM(512, 64, hidden_dim=64, num_layers=2, num_heads=4, dropout=0.0)
        model.compile(optimizer=keras.optimizers.Adam(1e-3))

    class StepTimes(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            self.start = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            times.append(time.perf_counter() - self.start)

    times = []
    if dataset is not None:
        fit_data = {"x": dataset}
    else:
        fit_data = {"x": x, "y": y, "batch_size": batch_size}
    history = model.fit(**fit_data, epochs=1, shuffle=False, verbose=0, callbacks=[StepTimes()])
    weights = np.concatenate([np.ravel(w) for w in model.get_weights()])
    sharded = sorted(v.path for v in model.weights if "model" in sharded_axes(v))
    if args.weights_out:
        np.save(args.weights_out, weights)
    tokens = args.global_batch * x.shape[1]
    return {
        "setup": setup, "backend": backend, "replicas": replicas, "steps": len(times),
        "loss": float(history.history["loss"][-1]),
        "tokens_per_second": tokens * (len(times) - 1) / sum(times[1:]),
        "weights_sum": float(weights.astype("float64").sum()),
        "weights_abs_sum": float(np.abs(weights.astype("float64")).sum()),
        "sharded_over_model": sharded,
    }  # fmt: skip


def sharded_axes(variable):
    """The mesh axes a (JAX) variable's value is split over; empty if replicated."""
    spec = getattr(getattr(variable.value, "sharding", None), "spec", None) or ()
    axes = set()
    for axis in spec:
        axes.update(axis if isinstance(axis, tuple) else [axis])
    return axes - {None}


def free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def run_copies(args, count, flags_for, env_for, what):
    """Runs `count` copies of this script, copy `index` with `flags_for(index)` and the
    environment `env_for(index)`, each writing its results to a file; returns them."""
    import tempfile

    folder = tempfile.mkdtemp()
    processes = []
    for index in range(count):
        command = [sys.executable, __file__, *flags_for(index), "--steps", str(args.steps),
                   "--global-batch", str(args.global_batch),
                   "--out", f"{folder}/{index}.json"]  # fmt: skip
        if args.weights_out:
            command += ["--weights-out", args.weights_out.replace(".npy", f".{index}.npy")]
        processes.append(subprocess.Popen(command, env=env_for(index)))
    try:
        codes = [p.wait(timeout=600) for p in processes]
    finally:
        for p in processes:  # none outlives a failure or a timeout
            if p.poll() is None:
                p.kill()
    if any(codes):
        raise SystemExit(f"a {what} failed: exit codes {codes}")
    results = []
    for index in range(count):
        with open(f"{folder}/{index}.json") as f:
            results.append(json.load(f))
    return results


def launch_workers(args):
    """Starts `--workers` copies of this script, one per TensorFlow worker, each with its
    TF_CONFIG on loopback and one CPU thread pool; returns their results."""
    cluster = {"worker": [f"127.0.0.1:{port}" for port in free_ports(args.workers)]}
    return run_copies(
        args, args.workers,
        lambda index: ["--workers", str(args.workers), "--worker-index", str(index)],
        lambda index: dict(os.environ, TF_CONFIG=json.dumps(
            {"cluster": cluster, "task": {"type": "worker", "index": index}})),
        "worker",
    )  # fmt: skip


def launch_jax_processes(args):
    """Starts `--jax-processes` copies of this script, one JAX process each with one CPU
    device, coordinated on a loopback port; returns their results."""
    coordinator = f"127.0.0.1:{free_ports(1)[0]}"
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1")
    return run_copies(
        args, args.jax_processes,
        lambda index: ["--jax-processes", str(args.jax_processes), "--process-id", str(index),
                       "--coordinator", coordinator],
        lambda index: env, "JAX process",
    )  # fmt: skip


def main(argv=None):
    args = parse_args(argv)
    if args.jax_processes > 1 and args.process_id is None:
        results = launch_jax_processes(args)
    elif args.workers > 1 and args.worker_index is None:
        results = launch_workers(args)
    else:
        results = [train(args)]
    # a worker or process started by the launcher, which prints
    quiet = args.worker_index is not None or args.process_id is not None
    for index, r in enumerate([] if quiet else results):
        who = f"worker {index}: " if len(results) > 1 else ""
        print(
            f"{who}{r['setup']}: {r['steps']} steps, loss {r['loss']:.4f}, "
            f"{r['tokens_per_second']:,.0f} tokens/s, weights sum {r['weights_sum']:.6f}"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results if len(results) > 1 else results[0], f, indent=2)
    return results


if __name__ == "__main__":
    main()
