"""Benchmark: `fit` step time of the main-job causal LM with and without XLA, same run.

    python bench/training.py            # 60 steps per round, two rounds, alternating

Prints ms/step (after a warm-up fit that pays compilation) and the ratio; writes JSON. This is
the measurement behind `compile(jit_compile="auto")` turning XLA on for TensorFlow on CPU.
"""

import argparse
import json
import os
import platform
import time

import keras
import numpy as np

from keras_attn.models import CausalLM


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--sequence-length", type=int, default=64)
    parser.add_argument("--out", default="bench/results/training.json")
    args = parser.parse_args()
    n = args.batch * args.steps
    x = np.random.default_rng(0).integers(1, 2967, size=(n, args.sequence_length)).astype("int32")
    rows = []
    for round_ in range(args.rounds):
        for jit in (True, False):
            keras.utils.set_random_seed(0)
            model = CausalLM(2967, args.sequence_length, hidden_dim=128, num_layers=2)
            model.compile(optimizer="adam", jit_compile=jit)
            start = time.perf_counter()
            model.fit(x[: 2 * args.batch], x[: 2 * args.batch], batch_size=args.batch, verbose=0)
            warm = time.perf_counter() - start
            start = time.perf_counter()
            model.fit(x, x, batch_size=args.batch, verbose=0)
            ms = (time.perf_counter() - start) / args.steps * 1000
            rows.append({"round": round_, "xla": jit, "warmup_s": warm, "ms_per_step": ms})
            print(f"round {round_}  xla={jit!s:<5}  warm-up fit {warm:5.1f} s  {ms:6.0f} ms/step")
    mean = lambda jit: np.mean([r["ms_per_step"] for r in rows if r["xla"] is jit])  # noqa: E731
    ratio = mean(False) / mean(True)
    print(f"backend={keras.backend.backend()}  without XLA / with XLA: {ratio:.2f}x")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"benchmark": "fit step time, XLA vs not", "config": vars(args),
                   "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
                   "rows": rows, "speedup": ratio}, f, indent=2)  # fmt: skip
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
