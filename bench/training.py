"""Benchmark: training throughput, float32 / mixed bfloat16 x XLA on / off, ours vs plain Keras
(and keras-hub when installed), same config, same run.

    python bench/training.py                 # vocab 8192, seq 128, d 256, 4 heads, ffn 1024,
                                             # 4 layers, batch 32; 2 rounds, alternating
    python bench/training.py --steps 8 --rounds 1   # quicker

Models: our `CausalLM`; the same pre-norm decoder written with plain Keras layers
(`keras.layers.MultiHeadAttention` with a causal mask, LayerNormalization, Dense); keras-hub's
`TransformerDecoder` stack if `keras_hub` imports (`pip install keras-hub`, a bench-only peer).
Each cell is tokens/s of `fit`'s steps (first step's start to last step's end) after a
warm-up fit that pays compilation, medians over rounds. `default` rows are what each library
does untold: ours `compile(jit_compile="auto")` (`keras_attn.models.task.resolve_jit_compile`),
Keras's own `"auto"` (no XLA on a CPU-only TensorFlow). Prints the CPU flags
that decide the default (XLA for float32, none for bfloat16 on a CPU). Writes JSON.
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

from keras_attn.hardware import cpu_flags  # noqa: E402
from keras_attn.models import CausalLM  # noqa: E402
from keras_attn.models.task import resolve_jit_compile  # noqa: E402


def plain_keras(vocabulary, length, width, heads, ffn, layers):
    """The same pre-norm decoder from plain Keras layers."""
    ids = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(vocabulary, width)(ids)
    positions = keras.ops.expand_dims(keras.ops.arange(length), 0)
    x = x + keras.layers.Embedding(length, width)(positions)
    for _ in range(layers):
        h = keras.layers.LayerNormalization(epsilon=1e-5)(x)
        h = keras.layers.MultiHeadAttention(heads, width // heads)(h, h, use_causal_mask=True)
        x = x + h
        h = keras.layers.LayerNormalization(epsilon=1e-5)(x)
        h = keras.layers.Dense(ffn, activation="gelu")(h)
        x = x + keras.layers.Dense(width)(h)
    x = keras.layers.LayerNormalization(epsilon=1e-5)(x)
    logits = keras.layers.Dense(vocabulary, dtype="float32")(x)
    return keras.Model(ids, logits)


def keras_hub_model(vocabulary, length, width, heads, ffn, layers):
    import keras_hub

    ids = keras.Input((None,), dtype="int32")
    x = keras_hub.layers.TokenAndPositionEmbedding(vocabulary, length, width)(ids)
    for _ in range(layers):
        x = keras_hub.layers.TransformerDecoder(ffn, heads, normalize_first=True)(x)
    logits = keras.layers.Dense(vocabulary, dtype="float32")(x)
    return keras.Model(ids, logits)


def build(name, args):
    shape = (args.vocabulary, args.sequence_length, args.width, args.heads, args.ffn, args.layers)
    if name == "ours":
        return CausalLM(args.vocabulary, args.sequence_length, hidden_dim=args.width,
                        num_layers=args.layers, num_heads=args.heads,
                        intermediate_dim=args.ffn)  # fmt: skip
    return {"plain keras": plain_keras, "keras-hub": keras_hub_model}[name](*shape)


class StepClock(keras.callbacks.Callback):
    """Wall time from the first step's start to the last step's end. `fit`'s set-up and
    tear-down are left out: on the 2-core machine of 2026-11-23, tearing down the input
    pipeline after `fit` stalled 0 to 13 s at random, whichever the model (cProfile put it
    in `fit`'s own frame, after `on_train_end`)."""

    def on_train_batch_begin(self, batch, logs=None):
        if batch == 0:
            self.start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.end = time.perf_counter()


def measure(name, policy, xla, x, args):
    """tokens/s of `fit` for one cell; `xla` True, False or "default"."""
    keras.config.set_dtype_policy(policy)
    try:
        keras.utils.set_random_seed(0)
        model = build(name, args)
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        if xla == "default":
            model.compile(optimizer="adam", loss=loss)  # each library's own default
        else:
            model.compile(optimizer="adam", loss=loss, jit_compile=xla)
        chosen = model.jit_compile
        model.fit(x[: 2 * args.batch], x[: 2 * args.batch], batch_size=args.batch, verbose=0)
        clock = StepClock()
        model.fit(x, x, batch_size=args.batch, verbose=0, callbacks=[clock])
        seconds = clock.end - clock.start
    finally:
        keras.config.set_dtype_policy("float32")
    return x.size / seconds, bool(chosen)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocabulary", type=int, default=8192)
    parser.add_argument("--sequence-length", type=int, default=128)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--ffn", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default="bench/results/training.json")
    args = parser.parse_args()
    models = ["ours", "plain keras"]
    try:
        import keras_hub  # noqa: F401

        models.append("keras-hub")
    except ImportError:
        print("keras-hub is not installed: its rows are skipped (pip install keras-hub)")
    n = args.batch * args.steps
    rng = np.random.default_rng(0)
    x = rng.integers(1, args.vocabulary, size=(n, args.sequence_length)).astype("int32")
    cells = [(m, p, xla) for m in models for p in ("float32", "mixed_bfloat16")
             for xla in (True, False, "default")]  # fmt: skip
    samples = {cell: [] for cell in cells}
    chosen = {}
    for round_ in range(args.rounds):
        for cell in cells:
            tokens, chosen[cell] = measure(*cell, x, args)
            samples[cell].append(tokens)
            print(f"round {round_} {cell[0]:<12} {cell[1]:<15} xla={cell[2]!s:<8} "
                  f"{tokens:9,.0f} tokens/s", flush=True)  # fmt: skip

    print(f"\n{keras.backend.backend()}, {platform.processor() or 'CPU'}, {os.cpu_count()} "
          f"cores, flags: {' '.join(cpu_flags()) or '(none read)'}")  # fmt: skip
    print(f"our jit_compile='auto' here: float32 -> {resolve_jit_compile('auto', 'float32')}, "
          f"mixed_bfloat16 -> {resolve_jit_compile('auto', 'mixed_bfloat16')}")  # fmt: skip
    print(f"\n{'model':<13}{'policy':<16}{'XLA on':>10}{'XLA off':>10}{'default':>10}  (XLA?)")
    table = {}
    for m in models:
        for p in ("float32", "mixed_bfloat16"):
            row = {str(xla): statistics.median(samples[(m, p, xla)]) for xla in
                   (True, False, "default")}  # fmt: skip
            table[f"{m} {p}"] = {**row, "default_uses_xla": chosen[(m, p, "default")]}
            print(f"{m:<13}{p:<16}{row['True']:>10,.0f}{row['False']:>10,.0f}"
                  f"{row['default']:>10,.0f}  ({chosen[(m, p, 'default')]})")  # fmt: skip
    summary = {}
    for p in ("float32", "mixed_bfloat16"):
        # Our default is one of our two settings, measured twice: pool the two.
        xla = chosen[("ours", p, "default")]
        pooled = {setting: samples[("ours", p, setting)] for setting in (True, False)}
        pooled[xla] = pooled[xla] + samples[("ours", p, "default")]
        ours = {setting: statistics.median(v) for setting, v in pooled.items()}
        peers = max(table[f"{m} {p}"]["default"] for m in models if m != "ours")
        summary[p] = {
            "default_over_best_peer_default": ours[xla] / peers,
            "default_over_our_best_setting": ours[xla] / max(ours.values()),
            "our_best_setting_over_best_peer_default": max(ours.values()) / peers,
        }
        print(f"{p}: our default (XLA {'on' if xla else 'off'}) / best peer default "
              f"{ours[xla] / peers:.2f}x, / our best setting "
              f"{ours[xla] / max(ours.values()):.2f}x; ceiling (our best setting / best "
              f"peer default) {max(ours.values()) / peers:.2f}x")  # fmt: skip
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"config": vars(args), "cpu_flags": cpu_flags(), "cpus": os.cpu_count(),
                   "backend": keras.backend.backend(), "table": table, "summary": summary}, f,
                  indent=2)  # fmt: skip
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
