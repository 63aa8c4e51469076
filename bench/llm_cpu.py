"""Benchmark: decoders at the sizes users run on CPUs, float32 against weight-only int8/int4.

    python bench/llm_cpu.py                                  # three shapes, three weight types
    python bench/llm_cpu.py --shapes smollm2-135m --weights float32 int4   # quicker

For each shape (SmolLM2-135M, SmolLM2-360M, Qwen2.5-0.5B; RANDOM weights, the real widths,
2,048 positions) it writes a Hugging Face folder (`save_pretrained`, Llama / Qwen2 layout),
then, in a process of its own per weight type, loads it (`CausalLM.from_pretrained`) and
exports it (`formats=["generation"]`, `weights=...`), recording the export's seconds and its
process's memory high-water mark. It then times, in-process with onnxruntime on every core:
a 512-token prompt's prefill (one row), and one decode step for 1 and for 32 rows at
position 512 (one buffer per row count, bound once, as the server's `BucketedCache`).
Prints a table (tokens/s, ratios to float32) with the CPU flags and, as the physical limits
beside each figure, the memory bandwidth and float32 matmul rate measured in the same run: a
decode step reads every stored weight once (at most read bandwidth / file bytes tokens/s),
and a prompt token costs 2 FLOPs a parameter (at most matmul rate / 2·params); writes JSON.

Peers (llama.cpp through llama-cpp-python on GGUF Q4_0/Q8_0 of the same folder, and
onnxruntime-genai's int4 model builder) are issue 44's next step and not measured yet.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Run as a script, this file's folder leads sys.path, and bench/export.py would shadow the
# `export` package.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))

import numpy as np  # noqa: E402

# The published configurations' widths (vocabulary, hidden, layers, heads, key/value heads,
# feed-forward, rope theta, tied, q/k/v bias, model_type).
SHAPES = {
    "smollm2-135m": (49152, 576, 30, 9, 3, 1536, 100000.0, True, False, "llama"),
    "smollm2-360m": (49152, 960, 32, 15, 5, 2560, 100000.0, True, False, "llama"),
    "qwen2.5-0.5b": (151936, 896, 24, 14, 2, 4864, 1000000.0, True, True, "qwen2"),
}
MAX_LENGTH = 2048
PROMPT = 512

EXPORT = """
import json, sys, time
from keras_attn.models import CausalLM
from keras_attn_export import export_model
start = time.perf_counter()
lm = CausalLM.from_pretrained(sys.argv[1], preprocessor=None)
loaded = time.perf_counter()
weights = None if sys.argv[3] == "float32" else sys.argv[3]
export_model(lm, sys.argv[2], formats=["generation"], weights=weights, verbose=False)
with open("/proc/self/status") as f:
    (peak,) = [int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:")]
print("RESULT " + json.dumps({"load_s": loaded - start, "export_s": time.perf_counter() - loaded,
                              "peak_bytes": peak}))
"""


def write_folder(name: str, folder: Path) -> int:
    """The shape's Hugging Face folder (random weights); its parameter count."""
    import keras

    from keras_attn.models import DecoderBackbone

    vocab, hidden, layers, heads, kv, ffn, theta, tied, bias, model_type = SHAPES[name]
    keras.utils.set_random_seed(0)
    backbone = DecoderBackbone(
        vocab, MAX_LENGTH, hidden_dim=hidden, num_layers=layers, num_heads=heads,
        num_key_value_heads=kv, head_dim=hidden // heads, intermediate_dim=ffn,
        normalize_first=True, activation="swish", position_encoding="rotary", mask_zero=False,
        normalization="rms_norm", gated_feed_forward=True, attention_bias=bias,
        attention_output_bias=False, feed_forward_bias=False, rope_max_wavelength=theta,
        tie_word_embeddings=tied, layer_norm_epsilon=1e-6,
    )  # fmt: skip
    backbone.save_pretrained(folder, model_type=model_type)
    return int(backbone.count_params())


def export(folder: Path, out: Path, weights: str) -> dict:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run([sys.executable, "-c", EXPORT, str(folder), str(out), weights],
                          capture_output=True, text=True, check=False, env=env)  # fmt: skip
    if done.returncode:
        raise RuntimeError(done.stderr[-3000:])
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    return json.loads(line[len("RESULT ") :])


def timings(artifact: Path, rows: int = 32, repeats: int = 10) -> dict:
    """Median ms of a `PROMPT`-token prefill (one row) and of one decode step for 1 and for
    `rows` rows at position `PROMPT`."""
    import onnxruntime as ort
    from keras_attn_serving.generation import BucketedCache
    from keras_attn_serving.manifest import read_manifest

    spec = read_manifest(artifact).decoding.gqa.model_dump()
    session = ort.InferenceSession(str(artifact / spec["file"]), providers=["CPUExecutionProvider"])
    cache = BucketedCache(session, spec, rows)

    def timed(size: int, tokens: int, index: int, runs: int) -> float:
        binding = cache.bindings[cache.bucket(size)]
        ids = np.random.default_rng(0).integers(1, 1000, (cache.bucket(size), tokens))
        binding.bind_cpu_input("token_ids", ids.astype(np.int32))
        binding.bind_cpu_input("index", np.full(cache.bucket(size), index, np.int32))
        times = []
        for _ in range(runs + 2):
            start = time.perf_counter()
            session.run_with_iobinding(binding)
            times.append(time.perf_counter() - start)
        return 1000 * statistics.median(times[2:])

    return {"prefill_ms": timed(1, PROMPT, 0, 3), "step_1_ms": timed(1, 1, PROMPT, repeats),
            f"step_{rows}_ms": timed(rows, 1, PROMPT, max(3, repeats // 2))}  # fmt: skip


def machine() -> dict:
    """CPU flags, memory bandwidth and matmul rate, measured now: onnxruntime multiplying one
    row by a 1 GiB float32 matrix on every core (reading weights as a decode step does), a
    NumPy copy of 1 GiB (read + write), and NumPy's float32 2048³ matmul."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from keras_attn.hardware import cpu_flags

    k, n = 8192, 32768  # 1 GiB of float32
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "read",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k]),
         helper.make_tensor_value_info("w", TensorProto.FLOAT, [k, n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    reader = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    weights, row = np.ones((k, n), np.float32), np.ones((1, k), np.float32)
    target = np.empty_like(weights)
    copies, reads = [], []
    for _ in range(5):
        start = time.perf_counter()
        np.copyto(target, weights)
        copies.append(time.perf_counter() - start)
        start = time.perf_counter()
        reader.run(None, {"x": row, "w": weights})
        reads.append(time.perf_counter() - start)
    a = np.random.default_rng(0).standard_normal((2048, 2048)).astype(np.float32)
    a @ a
    start = time.perf_counter()
    for _ in range(5):
        a @ a
    matmul = (time.perf_counter() - start) / 5
    return {"cpu_flags": cpu_flags(), "cores": os.cpu_count(),
            "read_gb_s": weights.nbytes / min(reads) / 1e9,
            "copy_gb_s": 2 * weights.nbytes / min(copies) / 1e9,
            "matmul_gflop_s": 2 * 2048**3 / matmul / 1e9}  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--weights", nargs="+", default=["float32", "int8", "int4"],
                        choices=["float32", "int8", "int4"])  # fmt: skip
    parser.add_argument("--json", default="build/bench/llm_cpu.json")
    args = parser.parse_args(argv)
    report: dict = {"machine": machine(), "runs": []}
    print("machine:", json.dumps(report["machine"]), flush=True)
    header = ("shape", "params", "weights", "file MB", "export s", "peak GB",
              "prefill tok/s", "(matmul limit)", "1 stream tok/s", "(bandwidth limit)",
              "32 streams tok/s", "x float32 (1)")  # fmt: skip
    limits = report["machine"]
    print(" | ".join(header), flush=True)
    for shape in args.shapes:
        with tempfile.TemporaryDirectory() as work:
            folder = Path(work) / shape
            params = write_folder(shape, folder)
            base = None
            for weights in args.weights:
                out = Path(work) / f"{shape}-{weights}"
                row = {"shape": shape, "params": params, "weights": weights,
                       **export(folder, out, weights), **timings(out)}  # fmt: skip
                row["file_bytes"] = sum(p.stat().st_size for p in out.iterdir())
                row["quality"] = json.loads((out / "manifest.json").read_text())["decoding"]["gqa"][
                    "weights"
                ]
                row["prefill_tok_s"] = PROMPT / row["prefill_ms"] * 1e3
                row["decode_1_tok_s"] = 1e3 / row["step_1_ms"]
                row["decode_32_tok_s"] = 32e3 / row["step_32_ms"]
                # Physical limits: each decode step reads every stored weight once (the tied
                # table as the output projection); each token costs 2 FLOPs a parameter.
                row["bandwidth_limit_tok_s"] = limits["read_gb_s"] * 1e9 / row["file_bytes"]
                row["matmul_limit_tok_s"] = limits["matmul_gflop_s"] * 1e9 / (2 * params)
                base = base or row["decode_1_tok_s"]
                report["runs"].append(row)
                print(f"{shape} | {params / 1e6:.0f}M | {weights} | {row['file_bytes'] / 1e6:.0f}"
                      f" | {row['export_s']:.0f} | {row['peak_bytes'] / 1e9:.1f}"
                      f" | {row['prefill_tok_s']:.0f} | {row['matmul_limit_tok_s']:.0f}"
                      f" | {row['decode_1_tok_s']:.1f} | {row['bandwidth_limit_tok_s']:.1f}"
                      f" | {row['decode_32_tok_s']:.0f}"
                      f" | {row['decode_1_tok_s'] / base:.2f}", flush=True)  # fmt: skip
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
