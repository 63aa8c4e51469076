"""Benchmark: the lecture's complexity table, measured. Self-attention against an LSTM and a
1-D convolution of the same width, over sequence lengths n = 64 ... 4096, at d = 256.

    python bench/complexity.py                  # n = 64 ... 4096, forward and forward+backward
    python bench/complexity.py --max-n 1024     # quicker

The table says: self-attention O(n²·d) operations and O(1) sequential steps, a recurrent layer
O(n·d²) and O(n) sequential steps, a convolution O(k·n·d²). Counted as multiply-adds x 2 for
these layers (batch 1): MultiHeadAttention (4 heads of 64) 8·n·d² (the four projections) +
4·n²·d (scores and the weighted sum); LSTM 16·n·d² (four gates over [x, h]); Conv1D (k = 3)
6·n·d². Attention's FLOPs pass the LSTM's at n = 2d = 512. Backward is counted as twice the
forward. Each layer runs as a `tf.function` (no XLA, so the LSTM keeps its fused kernel),
medians of interleaved repeats. Prints a table with FLOPs beside time, where the time curves
cross, writes JSON and a log-log PNG.
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_attn as ka  # noqa: E402
from keras_attn.hardware import cpu_flags  # noqa: E402


def flops(kind, n, d):
    return {"self-attention": 8 * n * d * d + 4 * n * n * d, "LSTM": 16 * n * d * d,
            "Conv1D (k=3)": 6 * n * d * d}[kind]  # fmt: skip


def layers(d):
    """`{kind: (call, layer)}`: what runs on `x (1, n, d)`, and the layer holding its weights."""
    attention = ka.MultiHeadAttention(4, d // 4)
    lstm = keras.layers.LSTM(d, return_sequences=True)
    conv = keras.layers.Conv1D(d, 3, padding="same")
    return {
        "self-attention": (lambda x: attention(x, x), attention),
        "LSTM": (lstm, lstm),
        "Conv1D (k=3)": (conv, conv),
    }


def timed(fn, repeats):
    fn()  # trace and warm up
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return samples


def crossing(ns, a, b):
    """The first n where curve `a` is above curve `b` (after being below), else None."""
    for previous, n, x, y in zip(ns, ns[1:], a[1:], b[1:], strict=False):
        if x > y:
            return previous, n
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d", type=int, default=256)
    parser.add_argument("--max-n", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="bench/results/complexity.json")
    args = parser.parse_args()
    ns = [n for n in (64, 128, 256, 512, 1024, 2048, 4096, 8192) if n <= args.max_n]
    d = args.d
    built = layers(d)
    modes = ("forward", "forward+backward")
    results = {(kind, mode): [] for kind in built for mode in modes}
    for n in ns:
        x = tf.constant(np.random.default_rng(0).standard_normal((1, n, d)), tf.float32)
        for kind, (call, layer) in built.items():
            forward = tf.function(lambda x, call=call: call(x))
            forward(x)  # builds the weights
            weights = [v.value for v in layer.trainable_variables]

            @tf.function
            def both(x, forward=forward, weights=weights):
                with tf.GradientTape() as tape:
                    tape.watch(x)
                    loss = tf.reduce_sum(forward(x) ** 2)
                return tape.gradient(loss, [x, *weights])

            for mode, fn in zip(modes, (forward, both), strict=True):
                seconds = statistics.median(timed(lambda fn=fn, x=x: fn(x), args.repeats))
                factor = 1 if mode == "forward" else 3
                results[(kind, mode)].append(
                    {"n": n, "ms": 1000 * seconds, "gflop": factor * flops(kind, n, d) / 1e9,
                     "gflops_per_s": factor * flops(kind, n, d) / seconds / 1e9})  # fmt: skip
        print(f"n={n} done", flush=True)

    print(f"\nd = {d}, batch 1, TensorFlow {tf.__version__}, {platform.processor() or 'CPU'}, "
          f"{os.cpu_count()} cores, flags: {' '.join(cpu_flags()) or '(none read)'}")  # fmt: skip
    summary = {}
    for mode in modes:
        print(f"\n{mode}: ms (GFLOP)")
        print(f"{'n':>6}" + "".join(f"{kind:>26}" for kind in built))
        for i, n in enumerate(ns):
            cells = "".join(
                f"{results[(k, mode)][i]['ms']:>15.2f} ({results[(k, mode)][i]['gflop']:>7.3f})"
                for k in built
            )
            print(f"{n:>6}{cells}")
        times = {k: [r["ms"] for r in results[(k, mode)]] for k in built}
        crossed = crossing(ns, times["self-attention"], times["LSTM"])
        # The measured exponent: the log-log slope over the last doubling of n.
        slopes = {k: float(np.log2(t[-1] / t[-2])) for k, t in times.items()}
        summary[mode] = {"attention_passes_lstm_between": crossed, "last_slopes": slopes}
        print("log-log slope over the last doubling: " + ", ".join(
            f"{k} {v:.2f}" for k, v in slopes.items()))  # fmt: skip
        if crossed:
            print(f"self-attention takes longer than the LSTM between n = {crossed[0]} and "
                  f"{crossed[1]}")  # fmt: skip
        else:
            ratio = times["self-attention"][-1] / times["LSTM"][-1]
            gap = slopes["self-attention"] - slopes["LSTM"]
            ahead = ns[-1] * 2 ** (np.log2(1 / ratio) / gap) if gap > 0 else float("inf")
            summary[mode]["extrapolated_crossover_n"] = float(ahead)
            print(
                f"self-attention stays faster than the LSTM up to n = {ns[-1]} ({ratio:.2f}x "
                f"its time); at these slopes the curves cross near n = {ahead:,.0f}"
            )
    print(
        f"FLOP prediction: attention's operations pass the LSTM's at n = 2d = {2 * d}; the "
        "LSTM's n sequential steps (the table's O(n) column) keep its time above its FLOPs"
    )
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"d": d, "cpu_flags": cpu_flags(), "tensorflow": tf.__version__,
                   "results": {f"{k} {m}": v for (k, m), v in results.items()},
                   "summary": summary, "flop_crossover_n": 2 * d}, f, indent=2)  # fmt: skip
    plot(results, ns, args.out.replace(".json", ".png"), d)
    print(f"wrote {args.out} and its .png")


def plot(results, ns, path, d):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
    for axis, mode in zip(axes, ("forward", "forward+backward"), strict=True):
        for (kind, m), rows in results.items():
            if m == mode:
                axis.loglog(ns, [r["ms"] for r in rows], marker="o", label=kind)
        axis.axvline(2 * d, color="grey", linestyle=":", label="FLOPs cross (n = 2d)")
        axis.set_title(f"{mode}, d = {d}")
        axis.set_xlabel("sequence length n")
        axis.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("ms (median)")
    axes[0].legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
