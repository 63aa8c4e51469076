"""Benchmark: keras_attn.MultiHeadAttention vs keras.layers.MultiHeadAttention, same run.

Both layers get the same weights and inputs, are compiled the same way (`tf.function` on the
TensorFlow backend, `jax.jit` on JAX), and are timed interleaved, so machine noise hits both.
Rows: sequence length x dropout x mode, where mode is
  forward        inference (`training=False`)
  fwd+bwd        forward and gradient of sum(output) w.r.t. weights, `training=False`
  fwd+bwd train  the same with `training=True` (dropout active), for dropout > 0
Prints a table with the ratio keras_time / our_time (> 1 means ours is faster) and writes JSON.

    python bench/attention.py                      # batch 8, d 256, 8 heads, seq 128/512/2048
    KERAS_BACKEND=jax python bench/attention.py --seq 128 512 --out bench/results/jax.json
"""

import argparse
import json
import os
import platform
import statistics
import time

import keras
import numpy as np

import keras_attn as ka


def compile_fns(layer, x, training, backend):
    """(forward, forward+backward) callables that run `layer(x, x)` compiled."""
    if backend == "tensorflow":
        import tensorflow as tf

        @tf.function(jit_compile=False, reduce_retracing=True)
        def forward(x):
            return layer(x, x, training=training)

        @tf.function(jit_compile=False, reduce_retracing=True)
        def forward_backward(x):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(layer(x, x, training=training))
            return tape.gradient(loss, layer.trainable_variables)

        return (lambda: forward(x).numpy()), (lambda: [g.numpy() for g in forward_backward(x)])
    if backend == "jax":
        import jax
        import jax.numpy as jnp

        trainable = [v.value for v in layer.trainable_variables]
        other = [v.value for v in layer.non_trainable_variables]

        def run(tv, x):
            out, _ = layer.stateless_call(tv, other, x, x, training=training)
            return out

        fwd = jax.jit(run)
        grad = jax.jit(jax.grad(lambda tv, x: jnp.sum(run(tv, x))))
        return (
            lambda: fwd(trainable, x).block_until_ready(),
            lambda: jax.block_until_ready(grad(trainable, x)),
        )
    raise SystemExit(f"unsupported backend {backend!r}: use tensorflow or jax")


def time_pair(fn_a, fn_b, repeats, warmup=2):
    """Median seconds of two callables, run alternately so noise affects both alike."""
    for _ in range(warmup):
        fn_a()
        fn_b()
    a, b = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        fn_a()
        a.append(time.perf_counter() - t)
        t = time.perf_counter()
        fn_b()
        b.append(time.perf_counter() - t)
    return statistics.median(a), statistics.median(b)


def bench_row(seq, dropout, mode, args, backend):
    keras.utils.set_random_seed(0)
    key_dim = args.dim // args.heads
    ours = ka.MultiHeadAttention(args.heads, key_dim, dropout=dropout)
    ref = keras.layers.MultiHeadAttention(args.heads, key_dim, dropout=dropout)
    x = np.random.default_rng(0).normal(size=(args.batch, seq, args.dim)).astype("float32")
    ours(x, x)
    ref(x, x)
    ours.set_weights(ref.get_weights())
    x = keras.ops.convert_to_tensor(x)
    training = mode == "fwd+bwd train"
    ours_fwd, ours_bwd = compile_fns(ours, x, training, backend)
    ref_fwd, ref_bwd = compile_fns(ref, x, training, backend)
    pick = 0 if mode == "forward" else 1
    ours_fn, ref_fn = (ours_fwd, ours_bwd)[pick], (ref_fwd, ref_bwd)[pick]
    repeats = args.repeats if seq < 2048 else max(3, args.repeats // 2)
    t_ours, t_ref = time_pair(ours_fn, ref_fn, repeats)
    return {
        "seq": seq,
        "dropout": dropout,
        "mode": mode,
        "ours_ms": 1000 * t_ours,
        "keras_ms": 1000 * t_ref,
        "ratio": t_ref / t_ours,
        "repeats": repeats,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--seq", type=int, nargs="+", default=[128, 512, 2048])
    parser.add_argument(
        "--repeats", type=int, default=20, help="interleaved pairs per row (half at seq 2048)"
    )
    parser.add_argument("--out", default="bench/results/attention.json")
    args = parser.parse_args()
    backend = keras.backend.backend()

    rows = []
    print(f"backend={backend} batch={args.batch} dim={args.dim} heads={args.heads}")
    header = f"{'seq':>5} {'dropout':>7} {'mode':<14} {'ours ms':>9} {'keras ms':>9} {'ratio':>6}"
    print(header)
    print("-" * len(header))
    for seq in args.seq:
        for dropout in (0.0, 0.1):
            modes = ["forward", "fwd+bwd"] + (["fwd+bwd train"] if dropout else [])
            for mode in modes:
                row = bench_row(seq, dropout, mode, args, backend)
                rows.append(row)
                print(
                    f"{seq:>5} {dropout:>7} {mode:<14} {row['ours_ms']:>9.2f} "
                    f"{row['keras_ms']:>9.2f} {row['ratio']:>5.2f}x",
                    flush=True,
                )
    result = {
        "benchmark": "MultiHeadAttention: keras_attn vs keras.layers (ratio = keras / ours)",
        "backend": backend,
        "keras": keras.__version__,
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "config": vars(args),
        "rows": rows,
    }
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
