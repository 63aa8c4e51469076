"""Benchmark: greedy generation with and without the key/value cache, same model, same run.

    python bench/generation.py                     # 256 new tokens, main-job-sized model
    python bench/generation.py --new-tokens 64     # quicker
    python bench/generation.py --onnx              # also: the exported decode graphs in onnxruntime

Cached: the prompt is prefilled once, then one compiled loop (`ops.while_loop`; XLA on
TensorFlow) decodes every new token over the key/value cache. Uncached (the reference):
a Python loop that recomputes the whole prefix with the full model for every token.
Prints steady-state new tokens per second for each path (after a warm-up call with the same
shapes, whose time is printed too), their ratio, and whether the tokens agree; writes JSON.
Runs on the current Keras backend.
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time

# Run as a script, this file's folder leads sys.path, and bench/export.py and
# bench/tokenizers.py would shadow the `export` and `tokenizers` packages.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_attn.models import build_causal_lm, generate  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--prompt-length", type=int, default=16)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--hidden-dim", type=int, default=128)
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument(
        "--onnx",
        action="store_true",
        help="also time the exported decode_gqa.onnx and decode.onnx in onnxruntime",
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="bench/results/generation.json")
    args = parser.parse_args()

    keras.utils.set_random_seed(0)
    length = args.prompt_length + args.new_tokens
    model = build_causal_lm(3000, length, hidden_dim=args.hidden_dim, num_layers=args.num_layers)
    rng = np.random.default_rng(0)
    prompts = rng.integers(1, 3000, size=(args.batch, args.prompt_length)).tolist()
    paths = {
        "cached": lambda: generate(model, prompts, args.new_tokens, use_cache=True),
        "uncached": lambda: generate(model, prompts, args.new_tokens, use_cache=False),
    }
    if args.onnx:
        # The exported decode graphs driven by serving.Predictor: decode_gqa.onnx
        # (onnxruntime's GroupQueryAttention, cache bound in place; what serving uses) and
        # decode.onnx (tf2onnx of the Keras step, cache copied in and out).
        import tempfile

        from keras_attn_export import export_model
        from keras_attn_serving import Predictor

        folder = tempfile.mkdtemp() + "/lm"
        export_model(model, folder, formats=["onnx"], verbose=False)
        predictor = Predictor(folder)
        paths["onnx_gqa"] = lambda: predictor.generate_ids(prompts, args.new_tokens)
        paths["onnx_tf2onnx"] = lambda: predictor.generate_ids(
            prompts, args.new_tokens, use_cache="decode.onnx"
        )
    outputs, first_call, times = {}, {}, {name: [] for name in paths}
    for name, run in paths.items():
        # Warm-up with the timed shapes: tracing and XLA compilation, reported apart.
        start = time.perf_counter()
        outputs[name] = run()
        first_call[name] = time.perf_counter() - start
    for _ in range(args.repeats):  # interleaved, so machine noise hits every path alike
        for name, run in paths.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    rows = []
    for name in paths:
        seconds = statistics.median(times[name])
        rows.append({"path": name, "seconds": seconds, "first_call_s": first_call[name],
                     "tokens_per_s": args.batch * args.new_tokens / seconds})  # fmt: skip
    rate = {row["path"]: row["tokens_per_s"] for row in rows}
    ratio = rate["cached"] / rate["uncached"]
    same = outputs["cached"] == outputs["uncached"]
    print(f"backend={keras.backend.backend()} batch={args.batch} prompt={args.prompt_length} "
          f"new={args.new_tokens} d={args.hidden_dim} layers={args.num_layers} "
          f"(median of {args.repeats} interleaved runs)")  # fmt: skip
    for row in rows:
        print(f"{row['path']:<13}{row['tokens_per_s']:>10.1f} tokens/s  ({row['seconds']:.3f} s; "
              f"first call with tracing/compilation {row['first_call_s']:.2f} s)")  # fmt: skip
    print(f"cached / uncached: {ratio:.2f}x; same tokens: {same}")
    onnx_ratio = None
    if args.onnx:
        onnx_ratio = rate["onnx_gqa"] / rate["cached"]
        same_onnx = outputs["onnx_gqa"] == outputs["onnx_tf2onnx"] == outputs["cached"]
        print(
            f"onnx decode_gqa.onnx / Keras cached: {onnx_ratio:.2f}x; decode.onnx / Keras "
            f"cached: {rate['onnx_tf2onnx'] / rate['cached']:.2f}x; same tokens: {same_onnx}"
        )
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"benchmark": "greedy generation, cached vs uncached", "config": vars(args),
                   "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
                   "rows": rows, "ratio": ratio, "same_tokens": same,
                   "onnx_vs_keras_cached": onnx_ratio}, f, indent=2)  # fmt: skip
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
