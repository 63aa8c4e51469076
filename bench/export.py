"""Benchmark: exported ONNX (default, fused, int8) vs the TensorFlow paths, same model, same run.

    python bench/export.py               # BERT-small: 4 layers, d 256, 4 heads, ffn 1024
    python bench/export.py --repeats 3   # quicker

Exports a `SequenceClassifier` on a BERT-small `Encoder` (seq 128) with `export_model(...,
optimize=True, quantize="int8")`, then times, at batch 1 and batch 32: the SavedModel's
`serving_default` signature, an XLA-compiled `tf.function` of the Keras model (the best
TensorFlow path), and onnxruntime on `model.onnx`, `model.opt.onnx` and `model.int8.onnx`.
Rounds alternate between the paths; the median of each is reported, with ratios against the
SavedModel (batch 1) and against XLA (batch 32). Writes JSON with the fused-operator counts.

The row `matmuls only (floor)` is a graph of the model's matrix products alone (per block:
the q, k, v and output projections, q·kᵀ and weights·v per head, the two FFN layers, with
the head split and merge), no softmax, LayerNorm, GELU, bias or embedding: what any fp32
graph of this model must compute. Its ratio bounds the ratio a fused fp32 graph can reach.
"""

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

# Run as a script, this file's folder leads sys.path, and bench/export.py and
# bench/tokenizers.py would shadow the `export` and `tokenizers` packages.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import keras  # noqa: E402
import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402
import tensorflow as tf  # noqa: E402
from keras_attn_export import export_model  # noqa: E402

from keras_attn.models import Encoder, SequenceClassifier  # noqa: E402


def timer(fn, repeats):
    fn()  # warm-up (tracing, XLA compilation, onnxruntime's first run)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return samples


def matmul_floor(path, batch, seq, hidden, heads, ffn, layers):
    """Writes the model's matrix products alone as an ONNX graph (`x (batch, seq, hidden)`)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, weights = [], []

    def node(op, inputs, **attributes):
        out = f"t{len(nodes)}"
        nodes.append(helper.make_node(op, inputs, [out], **attributes))
        return out

    def weight(rows, cols):
        name = f"w{len(weights)}"
        array = (0.05 * rng.standard_normal((rows, cols))).astype("float32")
        weights.append(numpy_helper.from_array(array, name))
        return name

    def split(x, perm):  # (B, T, H·d) -> (B, H, T, d), or (B, H, d, T) for keys
        return node("Transpose", [node("Reshape", [x, "heads"])], perm=perm)

    x = "x"
    for _ in range(layers):
        q, k, v = (node("MatMul", [x, weight(hidden, hidden)]) for _ in range(3))
        scores = node("MatMul", [split(q, [0, 2, 1, 3]), split(k, [0, 2, 3, 1])])
        out = node("MatMul", [scores, split(v, [0, 2, 1, 3])])
        out = node("Reshape", [node("Transpose", [out], perm=[0, 2, 1, 3]), "merged"])
        x = node("MatMul", [out, weight(hidden, hidden)])
        x = node("MatMul", [node("MatMul", [x, weight(hidden, ffn)]), weight(ffn, hidden)])
    weights += [
        numpy_helper.from_array(np.array([batch, seq, heads, hidden // heads]), "heads"),
        numpy_helper.from_array(np.array([batch, seq, hidden]), "merged"),
    ]
    graph = helper.make_graph(
        nodes, "matmul_floor",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, seq, hidden])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, None)], weights,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden-dim", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--intermediate-dim", type=int, default=1024)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="bench/results/export.json")
    args = parser.parse_args()

    keras.utils.set_random_seed(0)
    encoder = Encoder(
        8000,
        args.seq,
        hidden_dim=args.hidden_dim,
        num_layers=args.layers,
        num_heads=args.heads,
        intermediate_dim=args.intermediate_dim,
        dropout=0.0,
    )
    model = SequenceClassifier(encoder, 2, dropout=0.0)
    folder = tempfile.mkdtemp() + "/bert_small"
    manifest = export_model(model, folder, optimize=True, quantize="int8", verbose=False)
    signature = tf.saved_model.load(f"{folder}/saved_model").signatures["serving_default"]

    @tf.function(jit_compile=True)
    def xla(token_ids, segment_ids):
        return model({"token_ids": token_ids, "segment_ids": segment_ids}, training=False)

    options = ort.SessionOptions()  # onnxruntime's defaults: all graph optimizations on
    sessions = {
        file: ort.InferenceSession(f"{folder}/{file}", options, providers=["CPUExecutionProvider"])
        for file in manifest["onnx"]["files"]
    }
    rows = []
    rng = np.random.default_rng(0)
    for batch in [int(b) for b in args.batches.split(",")]:
        feeds = {"token_ids": rng.integers(1, 8000, (batch, args.seq)).astype("int32"),
                 "segment_ids": np.zeros((batch, args.seq), "int32")}  # fmt: skip
        tensors = {k: tf.constant(v) for k, v in feeds.items()}
        floor_path = f"{folder}/floor_{batch}.onnx"
        matmul_floor(floor_path, batch, args.seq, args.hidden_dim, args.heads,
                     args.intermediate_dim, args.layers)  # fmt: skip
        floor = ort.InferenceSession(floor_path, options, providers=["CPUExecutionProvider"])
        floor_feeds = {"x": rng.standard_normal((batch, args.seq, args.hidden_dim), "float32")}
        paths = {
            "saved_model": lambda t=tensors: signature(**t),
            "xla_tf_function": lambda t=tensors: xla(t["token_ids"], t["segment_ids"]),
            **{
                f"onnxruntime {f}": (lambda s=s, x=feeds: s.run(None, x))
                for f, s in sessions.items()
            },
            "matmuls only (floor)": lambda s=floor, x=floor_feeds: s.run(None, x),
        }
        samples = {name: [] for name in paths}
        repeats = args.repeats if batch == 1 else max(2, args.repeats // 4)
        for _ in range(args.rounds):  # alternate paths: machine noise hits all of them
            for name, fn in paths.items():
                samples[name] += timer(fn, repeats)
        for name, values in samples.items():
            rows.append({"batch": batch, "path": name,
                         "ms": 1000 * statistics.median(values)})  # fmt: skip
    by = {(r["batch"], r["path"]): r["ms"] for r in rows}
    for row in rows:
        baseline = "saved_model" if row["batch"] == 1 else "xla_tf_function"
        row["speedup_vs"] = baseline
        row["speedup"] = by[(row["batch"], baseline)] / row["ms"]
    print(f"BERT-small classifier: layers={args.layers} d={args.hidden_dim} heads={args.heads} "
          f"ffn={args.intermediate_dim} seq={args.seq}; {os.cpu_count()} CPUs")  # fmt: skip
    print(f"{'batch':>5}  {'path':<32}{'ms':>10}  speedup")
    for row in rows:
        print(f"{row['batch']:>5}  {row['path']:<32}{row['ms']:>10.2f}  "
              f"{row['speedup']:.2f}x vs {row['speedup_vs']}")  # fmt: skip
    print("fused operators per file:", json.dumps(manifest["onnx"]["fused_ops"]))
    print("int8 drift:", json.dumps(manifest["int8"]))
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"benchmark": "exported BERT-small: onnxruntime vs TensorFlow",
                   "config": vars(args), "rows": rows, "fused_ops": manifest["onnx"]["fused_ops"],
                   "int8": manifest["int8"], "versions": manifest["versions"],
                   "machine": {"platform": platform.platform(), "cpus": os.cpu_count()}},
                  f, indent=2)  # fmt: skip
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
