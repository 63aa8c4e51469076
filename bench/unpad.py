"""What the padding-free encoder saves, by batch shape: raw onnxruntime on MiniLM-L6.

    python bench/unpad.py                  # 512 requests of serve_traffic's mix, 5 passes
    python bench/unpad.py --requests 128 --passes 1   # quicker

Four graphs from one export of all-MiniLM-L6-v2, all fused (`keras_attn_export.optimize`):
`padded` (`unpad=False`: every position computed), `unpadded` (`fuse()` alone: per-position
work on the kept tokens, q/k/v packed in `Attention` and so still computed on every
position), `qkv-unpadded` (q, k and v projected on the kept tokens too, then
`MultiHeadAttention`, since onnxruntime's CPU `MultiHeadAttention` refuses packed q/k/v: the
exported graph with that branch forced) and `switched`, the exported `model.opt.onnx`: both
behind one `If` on the batch's padding share, at the threshold measured at export
(`keras_attn_export.qkv_switch`). Batches: serve_traffic's requests in arrival order (32 rows)
and length-sorted (4, 16 and 32 rows), and full rows. Prints requests/s (medians of the
passes) with the CPU flags and writes JSON. Outputs at real positions are compared with the
padded graph's first.
"""

import argparse
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_traffic

from keras_attn.hardware import cpu_flags


def graphs(folder: Path) -> dict[str, Path]:
    import onnx
    from keras_attn_export import qkv_switch
    from keras_attn_export.optimize import fuse

    model = onnx.load(folder / "model.onnx")
    paths = {"padded": folder / "padded.onnx", "unpadded": folder / "packed.onnx",
             "qkv-unpadded": folder / "qkv.onnx",
             "switched": folder / "model.opt.onnx"}  # fmt: skip
    onnx.save(fuse(model, unpad=False), paths["padded"])
    onnx.save(fuse(model), paths["unpadded"])  # q/k/v packed, no switch
    switched = onnx.load(paths["switched"])
    onnx.save(qkv_switch.with_threshold(switched, qkv_switch.ALWAYS), paths["qkv-unpadded"])
    return paths


def schedules(ids: list[np.ndarray], rng) -> dict[str, tuple[list[np.ndarray], list[list[int]]]]:
    """`{name: (rows, batches)}`: the traffic in arrival order and sorted, and full rows."""
    count = len(ids)
    shapes = {
        "arrival 32": (ids, [list(range(s, min(s + 32, count))) for s in range(0, count, 32)])
    }
    for size in (4, 16, 32):
        shapes[f"sorted {size}"] = (ids, serve_traffic.sorted_batches(ids, size))
    for rows, length in ((32, 128), (16, 20)):
        full = [rng.integers(1000, 20000, length).astype("int32") for _ in range(4 * rows)]
        batches = [list(range(s, s + rows)) for s in range(0, 4 * rows, rows)]
        shapes[f"full {rows}x{length}"] = (full, batches)
    return shapes


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=512)
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--long", type=float, default=0.1, help="share of long passages")
    parser.add_argument("--out", default="bench/results/unpad.json")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="unpad_")) / "minilm"
    tokenizer, packer, _ = serve_traffic.export_minilm(folder)
    _, ids = serve_traffic.traffic(tokenizer, packer, args.requests, args.long)
    sessions = {name: serve_traffic.raw_session(path) for name, path in graphs(folder).items()}
    block = np.zeros((8, 64), "int32")
    for row in range(8):
        block[row, : min(64, len(ids[row]))] = ids[row][:64]
    outputs = {name: s.run(["sequence_output"], serve_traffic.feeds_for(s, block))[0]
               for name, s in sessions.items()}  # fmt: skip
    diffs = {name: float(np.abs(out - outputs["padded"])[block != 0].max())
             for name, out in outputs.items()}  # fmt: skip
    rates: dict = {}
    shapes = schedules(ids, np.random.default_rng(0))
    for _ in range(args.passes):  # interleaved: a drift moves every graph alike
        for shape, (rows, batches) in shapes.items():
            for name, session in sessions.items():
                seconds, padding = serve_traffic.raw_run(session, rows, batches)
                rates.setdefault(shape, {"padding": padding}).setdefault(name, []).append(
                    sum(len(b) for b in batches) / seconds
                )
    flags = cpu_flags()
    switch = json.loads((folder / "manifest.json").read_text())["onnx"]["qkv_switch"]
    print(
        "q/k/v switch measured at export:",
        json.dumps(switch["model.opt.onnx"]["timings"]),
        "threshold",
        switch["model.opt.onnx"]["threshold"],
    )
    print(f"MiniLM-L6, raw onnxruntime, {os.cpu_count()} CPUs, flags: {' '.join(flags)}; "
          f"{len(ids)} requests; max |diff| at real positions vs padded: "
          + ", ".join(f"{k} {v:.1e}" for k, v in diffs.items()))  # fmt: skip
    names = list(sessions)
    print(f"{'batches':<14}{'padding':>9}" + "".join(f"{n + ' req/s':>20}" for n in names)
          + f"{'unpadded ÷ padded':>19}{'qkv ÷ unpadded':>16}{'switched ÷ best':>17}")  # fmt: skip
    table = {}
    for shape, row in rates.items():
        medians = {n: float(np.median(row[n])) for n in names}
        table[shape] = {"padding": row["padding"], **medians}
        cells = "".join(f"{medians[n]:>20.1f}" for n in names)
        best = max(medians["unpadded"], medians["qkv-unpadded"])
        print(f"{shape:<14}{100 * row['padding']:>8.1f}%{cells}"
              f"{medians['unpadded'] / medians['padded']:>19.2f}"
              f"{medians['qkv-unpadded'] / medians['unpadded']:>16.2f}"
              f"{medians['switched'] / best:>17.2f}")  # fmt: skip
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"benchmark": "padding-free MiniLM graphs by batch shape", "config": vars(args),
                   "max_abs_diff_vs_padded": diffs, "requests_per_s": table,
                   "qkv_switch": switch["model.opt.onnx"],
                   "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                               "flags": flags}}, f, indent=2)  # fmt: skip
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
