"""Benchmark: keras_attn.MultiHeadAttention vs keras.layers.MultiHeadAttention, same run.

Both layers get the same weights and inputs, are compiled the same way (`tf.function` on the
TensorFlow backend, `jax.jit` on JAX), and are timed interleaved, so machine noise hits both.
Rows: sequence length x dropout x mode, where mode is
  forward        inference (`training=False`)
  fwd+bwd        forward and gradient of sum(output) w.r.t. weights, `training=False`
  fwd+bwd train  the same with `training=True` (dropout active), for dropout > 0
Prints a table with the ratio keras_time / our_time (> 1 means ours is faster) and writes JSON.

Forward rows on TensorFlow also time a floor in the same rounds: our forward's kernels with
nothing between them (the q, k, v and output projections as plain matmuls, then q·kᵀ, softmax
and weights·v per (batch, head) pair, or batched below `PER_HEAD_MIN_SCORES`, as the layer
chooses), with reshapes where the layer transposes and no bias, scale or mask. Its numbers are
not attention's, but every kernel has attention's shapes, so `keras / floor` is about the best
ratio any composition of these kernels can reach on this machine. Only a fused attention
kernel, which TensorFlow does not have, could go below the floor.

Each row takes the median of at least `--repeats` interleaved rounds, and of more where rounds
are short, so that every row spans ~`--min-seconds`.

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
from keras import ops

import keras_attn as ka
from keras_attn.layers.fused_attention import PER_HEAD_MIN_SCORES


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


def floor_forward(layer, x):
    """A callable running the floor (module docstring) of `layer`'s forward on `x`, TensorFlow."""
    import tensorflow as tf

    batch, seq, dim = x.shape
    pairs = batch * layer.num_heads
    kernels = [
        ops.reshape(dense.kernel, (dim, -1))
        for dense in (layer.query_dense, layer.key_dense, layer.value_dense)
    ]
    out_kernel = ops.reshape(layer.output_dense.kernel, (-1, dim))

    def core(q, k, v):
        return ops.matmul(ops.softmax(ops.matmul(q, ops.swapaxes(k, -1, -2)), axis=-1), v)

    @tf.function(jit_compile=False)
    def forward(x):
        rows = ops.reshape(x, (-1, dim))
        q, k, v = (ops.reshape(ops.matmul(rows, w), (pairs, seq, -1)) for w in kernels)
        if seq * seq >= PER_HEAD_MIN_SCORES:
            out = ops.map(lambda qkv: core(*qkv), (q, k, v))
        else:
            out = core(q, k, v)
        return ops.matmul(ops.reshape(out, (batch * seq, -1)), out_kernel)

    return lambda: forward(x).numpy()


def time_interleaved(fns, repeats, min_seconds, warmup=2):
    """Median seconds of each callable, run in turn each round so noise affects all alike.

    Runs at least `repeats` rounds, and more where rounds are short, until the rounds add up
    to ~`min_seconds`: a median of 20 rounds of a few milliseconds spans well under a second,
    and one slow spell on a shared machine can move it.
    Returns `(medians, rounds)`.
    """
    for _ in range(warmup):  # the first round traces; the last one times a round
        start = time.perf_counter()
        for fn in fns:
            fn()
    per_round = time.perf_counter() - start
    rounds = max(repeats, min(int(min_seconds / per_round), 50 * repeats))
    samples = [[] for _ in fns]
    for _ in range(rounds):
        for fn, times in zip(fns, samples, strict=True):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
    return [statistics.median(times) for times in samples], rounds


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
    fns = [ours_fn, ref_fn]
    if mode == "forward" and backend == "tensorflow":
        fns.append(floor_forward(ours, x))
    (t_ours, t_ref, *t_floor), repeats = time_interleaved(fns, repeats, args.min_seconds)
    row = {
        "seq": seq,
        "dropout": dropout,
        "mode": mode,
        "ours_ms": 1000 * t_ours,
        "keras_ms": 1000 * t_ref,
        "ratio": t_ref / t_ours,
        "repeats": repeats,
    }
    if t_floor:
        row["floor_ms"] = 1000 * t_floor[0]
        row["keras_over_floor"] = t_ref / t_floor[0]
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--seq", type=int, nargs="+", default=[128, 512, 2048])
    parser.add_argument(
        "--repeats",
        type=int,
        default=20,
        help="fewest interleaved rounds per row (half at seq 2048)",
    )
    parser.add_argument(
        "--min-seconds",
        type=float,
        default=4.0,
        help="rounds are added to short rows until they take about this long",
    )
    parser.add_argument("--out", default="bench/results/attention.json")
    args = parser.parse_args()
    backend = keras.backend.backend()

    rows = []
    print(f"backend={backend} batch={args.batch} dim={args.dim} heads={args.heads}")
    header = (
        f"{'seq':>5} {'dropout':>7} {'mode':<14} {'ours ms':>9} {'keras ms':>9} {'ratio':>6}"
        f" {'floor ms':>9} {'keras/floor':>11}"
    )
    print(header)
    print("-" * len(header))
    for seq in args.seq:
        for dropout in (0.0, 0.1):
            modes = ["forward", "fwd+bwd"] + (["fwd+bwd train"] if dropout else [])
            for mode in modes:
                row = bench_row(seq, dropout, mode, args, backend)
                rows.append(row)
                floor = (
                    f" {row['floor_ms']:>9.2f} {row['keras_over_floor']:>10.2f}x"
                    if "floor_ms" in row
                    else f" {'-':>9} {'-':>11}"
                )
                print(
                    f"{seq:>5} {dropout:>7} {mode:<14} {row['ours_ms']:>9.2f} "
                    f"{row['keras_ms']:>9.2f} {row['ratio']:>5.2f}x" + floor,
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
