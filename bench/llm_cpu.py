"""Benchmark: decoders at the sizes users run on CPUs: ours (float32, weight-only int8 and
int4) against llama.cpp and onnxruntime-genai on the same folder and cores.

    make bench-peers                                         # once: the peers (bench extra)
    python bench/llm_cpu.py                                  # three shapes, every system
    python bench/llm_cpu.py --shapes smollm2-135m --systems int4 llama.cpp-Q4_0 --rounds 1

For each shape (SmolLM2-135M, SmolLM2-360M, Qwen2.5-0.5B; RANDOM weights, the real widths,
2,048 positions) it writes a Hugging Face folder (`save_pretrained`, Llama / Qwen2 layout,
with a small byte-level BPE: the bench times ids, not text), then makes every system's files
from that folder, timing each conversion and (ours) its process's memory high-water mark:
- ours: `CausalLM.from_pretrained` and `export_model(formats=["generation"], weights=...)`,
  one process per weight type;
- llama.cpp: its `convert_hf_to_gguf.py` (float32 GGUF) and its quantizer (Q8_0, Q4_0);
- onnxruntime-genai: its model builder, int4 (block 32, accuracy level 4), CPU.

Then, in `--rounds` rounds (systems in turn, each in a process of its own, every core):
a 512-token prompt's prefill (one sequence), one decode step of one sequence at position 512,
and one decode step of 32 sequences at position `--batch-position` (80: the mean position of
the server's streams below). Ours runs its graph with onnxruntime as the server's
`BucketedCache` does; llama.cpp through llama-cpp-python's C API (`llama_decode`, the cache
of one sequence copied to the others); genai through its `Generator` (`append_tokens`,
`generate_next_token`, a static batch). Last, ours through `keras-attn-serve` on loopback:
32 clients streaming `/v1/completions` (16-id prompts, 128 new tokens each, greedy:
`temperature` 0, as the peers' steps choose nothing) for `--seconds`, with iteration-level
batching (`--max-decode-rows 32`); new tokens counted from the streams' usage, over the wall
time, prompts' prefills included. Beside it, the served run's ceiling: its steps and
admitting runs at ours' in-process times of the same round, and nothing else.

Prints a table per round and a summary (medians over rounds; the issue's goals as ratios,
per round) with the CPU flags and, as the physical limits beside each figure, the memory
bandwidth and float32 matmul rate measured in the same run: a decode step reads every stored
weight once (at most read bandwidth / file bytes tokens/s for one sequence), and a prompt
token costs 2 FLOPs a parameter (at most matmul rate / 2·params); writes JSON.
"""

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

# Run as a script, this file's folder leads sys.path, and bench/export.py would shadow the
# `export` package; it goes last instead (for llm_peers and serve_generate).
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))
sys.path.append(_HERE)

import numpy as np  # noqa: E402
from keras_attn_serving.shared_steps import PREFILL_ROWS  # noqa: E402
from llm_peers import genai_folder, gguf_files, missing, peer_times, result, run, timed  # noqa: E402
from serve_generate import start_server  # noqa: E402

# The published configurations' widths (vocabulary, hidden, layers, heads, key/value heads,
# feed-forward, rope theta, tied, q/k/v bias, model_type).
SHAPES = {
    "smollm2-135m": (49152, 576, 30, 9, 3, 1536, 100000.0, True, False, "llama"),
    "smollm2-360m": (49152, 960, 32, 15, 5, 2560, 100000.0, True, False, "llama"),
    "qwen2.5-0.5b": (151936, 896, 24, 14, 2, 4864, 1000000.0, True, True, "qwen2"),
    "tiny": (2048, 128, 2, 4, 2, 256, 100000.0, True, False, "llama"),  # a quick check only
}
OURS = ["float32", "int8", "int4"]
PEERS = ["llama.cpp-Q8_0", "llama.cpp-Q4_0", "genai-int4"]
SERVED = [f"served-{w}" for w in OURS]
MAX_LENGTH = 2048
PROMPT = 512
ROWS = 32
SERVED_PROMPT, SERVED_NEW = 16, 128

EXPORT = """
import json, sys, time
from keras_attn.models import CausalLM
from keras_attn_export import export_model
start = time.perf_counter()
lm = CausalLM.from_pretrained(sys.argv[1])
loaded = time.perf_counter()
weights = None if sys.argv[3] == "float32" else sys.argv[3]
export_model(lm, sys.argv[2], formats=["generation"], weights=weights, verbose=False)
with open("/proc/self/status") as f:
    (peak,) = [int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:")]
print("RESULT " + json.dumps({"load_s": loaded - start, "export_s": time.perf_counter() - loaded,
                              "peak_bytes": peak}))
"""


def write_folder(name: str, folder: Path) -> int:
    """The shape's Hugging Face folder (random weights, a 1,000-token byte-level BPE learned
    from the embedded corpus); its parameter count."""
    import keras

    from examples.toy_checkpoints import learn_bpe
    from keras_attn.data import load_corpus
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
    learn_bpe(load_corpus().lines()[:2000], 1000).save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>",
        "bos_token": "<|endoftext|>", "model_max_length": MAX_LENGTH}))  # fmt: skip
    return int(backbone.count_params())


def export(folder: Path, out: Path, weights: str) -> dict:
    return result(run([sys.executable, "-c", EXPORT, str(folder), str(out), weights], "export"))


def timings(artifact: Path, rows: int, position: int, repeats: int = 10) -> dict:
    """Median ms of a `PROMPT`-token prefill (one row; through the graph's prefill twin where
    the export wrote one, as the server runs it), of one decode step for 1 row at position
    `PROMPT` and for `rows` rows at `position`, and of the run that admits `PREFILL_ROWS`
    of the server's newcomers (`SERVED_PROMPT` ids each)."""
    import onnxruntime as ort
    from keras_attn_serving.generation import BucketedCache, load_prefill_twin
    from keras_attn_serving.manifest import read_manifest

    spec = read_manifest(artifact).decoding.gqa.model_dump()
    session = ort.InferenceSession(str(artifact / spec["file"]), providers=["CPUExecutionProvider"])
    twin = load_prefill_twin(artifact, spec, ort.SessionOptions(), session)
    cache = BucketedCache(session, spec, rows, twin)

    def run_ms(size: int, tokens: int, index: int, runs: int) -> float:
        bucket = cache.bucket(size)
        ids = np.random.default_rng(0).integers(1, 1000, (bucket, tokens)).astype(np.int32)
        index_ = np.full(bucket, index, np.int32)
        return timed(lambda: cache.run(bucket, ids, index_), runs)

    return {"prefill_ms": run_ms(1, PROMPT, 0, 3), "step_1_ms": run_ms(1, 1, PROMPT, repeats),
            f"step_{rows}_ms": run_ms(rows, 1, position, max(3, repeats // 2)),
            "admit_ms": run_ms(PREFILL_ROWS, SERVED_PROMPT, 0, max(3, repeats // 2)),
            "prefill_twin": None if twin is None else spec["weights"]["prefill"]}  # fmt: skip


async def served(url: str, clients: int, seconds: float) -> dict:
    """`clients` streaming `/v1/completions` clients (httpx) for `seconds` (after one warm-up
    request): new tokens (the streams' usage) over the wall time."""
    import httpx

    body = {"model": "llm", "max_tokens": SERVED_NEW, "stream": True, "temperature": 0,
            "stream_options": {"include_usage": True}}  # fmt: skip
    tokens, requests, errors = 0, 0, 0
    limits = httpx.Limits(max_connections=2 * clients)
    async with httpx.AsyncClient(timeout=600, limits=limits) as session:

        async def one(seed: int) -> int:
            prompt = np.random.default_rng(seed).integers(1, 1000, SERVED_PROMPT).tolist()
            request = {**body, "prompt": prompt}
            async with session.stream("POST", f"{url}/v1/completions", json=request) as r:
                if r.status_code != 200:
                    await r.aread()
                    return -1
                made = 0
                async for line in r.aiter_lines():
                    if line.startswith("data: {") and '"usage"' in line:
                        usage = json.loads(line[6:]).get("usage") or {}
                        made = usage.get("completion_tokens", made)
                return made

        await one(0)
        deadline = time.perf_counter() + seconds
        start = time.perf_counter()

        async def client(k: int) -> None:
            nonlocal tokens, requests, errors
            seed = k
            while time.perf_counter() < deadline:
                made = await one(seed)
                seed += clients
                requests, errors = requests + 1, errors + (made < 0)
                tokens += max(made, 0)

        await asyncio.gather(*(client(k) for k in range(clients)))
        wall = time.perf_counter() - start
    return {"served_tok_s": tokens / wall, "requests": requests, "errors": errors}


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


def build(shape: str, work: Path, systems: list[str]) -> tuple[int, dict]:
    """The shape's folder and every system's files from it: (params, {system: info})."""
    folder = work / shape
    params = write_folder(shape, folder)
    made: dict[str, dict] = {}
    for weights in OURS:
        if weights in systems or f"served-{weights}" in systems:
            out = work / f"repo-{weights}" / "llm" / "1"
            info = {"path": out, **export(folder, out, weights)}
            info["file_bytes"] = sum(p.stat().st_size for p in out.iterdir())
            info["quality"] = json.loads((out / "manifest.json").read_text())["decoding"]["gqa"][
                "weights"
            ]
            made[weights] = made[f"served-{weights}"] = info
    if any(s.startswith("llama.cpp") for s in systems):
        start = time.perf_counter()
        for name, path in gguf_files(folder, work).items():
            made[f"llama.cpp-{name}"] = {"path": path, "file_bytes": path.stat().st_size}
        for name in ("Q8_0", "Q4_0"):
            made[f"llama.cpp-{name}"]["export_s"] = time.perf_counter() - start
    if "genai-int4" in systems:
        start = time.perf_counter()
        out = genai_folder(folder, work)
        size = sum(p.stat().st_size for p in out.iterdir())
        made["genai-int4"] = {"path": out, "export_s": time.perf_counter() - start,
                              "file_bytes": size}  # fmt: skip
    return params, made


def measure(system: str, info: dict, position: int, seconds: float, urls: dict) -> dict:
    if system in OURS:
        return timings(info["path"], ROWS, position)
    if system in PEERS:
        return peer_times(system.split("-")[0], info["path"], PROMPT, ROWS, position)
    if system not in urls:  # started once, kept for every round
        urls[system] = start_server(info["path"].parent.parent, ROWS)
    return asyncio.run(served(urls[system][1], ROWS, seconds))


def served_ceiling(row: dict) -> float:
    """The most tokens/s the served run could reach (its floor in time): the steps and the
    newcomers' admitting runs its requests need, at the in-process times of the same round,
    and nothing else (no choosing, HTTP or waiting for clients). Each request: 1/`PREFILL_ROWS`
    of an admitting run, whose logits give its first id (its prompts are of one length), then
    `SERVED_NEW - 1` steps of `ROWS` rows."""
    step_ms = row[f"step_{ROWS}_ms"] / ROWS
    per_request_ms = (SERVED_NEW - 1) * step_ms + row["admit_ms"] / PREFILL_ROWS
    return SERVED_NEW * 1e3 / per_request_ms


def goals(rows: dict) -> dict:
    """The issue's goals as ratios (None where a system was not run)."""

    def ratio(a: str, b: str, key: str) -> float | None:
        return rows[a][key] / rows[b][key] if a in rows and b in rows else None

    batch = [rows[p]["decode_32_tok_s"] for p in PEERS if p in rows]
    served = rows.get("served-int4", {}).get("served_tok_s")
    ceiling = rows.get("served-int4", {}).get("served_ceiling_tok_s")
    return {"served_32_vs_ceiling": served / ceiling if served and ceiling else None,
            "ceiling_vs_best_peer_batch": ceiling / max(batch) if ceiling and batch else None,
            "decode_1_vs_llama_q4_0": ratio("int4", "llama.cpp-Q4_0", "decode_1_tok_s"),
            "decode_1_vs_genai_int4": ratio("int4", "genai-int4", "decode_1_tok_s"),
            "served_32_vs_best_peer_batch": served / max(batch) if served and batch else None,
            "prefill_vs_llama_q4_0": ratio("int4", "llama.cpp-Q4_0", "prefill_tok_s"),
            "prefill_vs_genai_int4": ratio("int4", "genai-int4", "prefill_tok_s")}  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES)[:3], choices=list(SHAPES))
    parser.add_argument("--systems", nargs="+", default=OURS + PEERS + SERVED,
                        choices=OURS + PEERS + SERVED)  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-position", type=int, default=SERVED_PROMPT + SERVED_NEW // 2)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--json", default="build/bench/llm_cpu.json")
    args = parser.parse_args(argv)
    why = missing()
    for peer, reason in why.items():
        print(f"{peer} not compared: {reason}")
    systems = [s for s in args.systems if s.split("-")[0] not in why]
    report: dict = {"machine": machine(), "systems": systems, "shapes": {}}
    limits = report["machine"]
    print("machine:", json.dumps(limits), flush=True)
    header = ("round", "system", "file MB", "convert s", "prefill tok/s", "1 stream tok/s",
              "(bandwidth limit)", "32 streams tok/s")  # fmt: skip
    for shape in args.shapes:
        urls: dict = {}
        with tempfile.TemporaryDirectory() as work:
            params, made = build(shape, Path(work), systems)
            print(
                f"\n{shape}: {params / 1e6:.0f}M parameters (random weights); prefill limit "
                f"{limits['matmul_gflop_s'] * 1e9 / (2 * params):.0f} tok/s (float32 matmul)"
            )
            print(" | ".join(header), flush=True)
            rounds = []
            try:
                for number in range(1, args.rounds + 1):
                    rows = {}
                    for system in systems:
                        info = made[system]
                        row = measure(system, info, args.batch_position, args.seconds, urls)
                        row.update({k: v for k, v in info.items() if k != "path"})
                        if "prefill_ms" in row:
                            row["prefill_tok_s"] = PROMPT / row["prefill_ms"] * 1e3
                            row["decode_1_tok_s"] = 1e3 / row["step_1_ms"]
                            row["decode_32_tok_s"] = ROWS * 1e3 / row[f"step_{ROWS}_ms"]
                        # A decode step reads every stored weight once (genai's file also holds
                        # a float32 embedding table that a step only gathers from).
                        row["bandwidth_limit_tok_s"] = limits["read_gb_s"] * 1e9 / row["file_bytes"]
                        rows[system] = row
                        cells = [
                            f"{row[k]:.1f}" if k in row else "-"
                            for k in ("prefill_tok_s", "decode_1_tok_s", "bandwidth_limit_tok_s")
                        ]
                        batch = row.get("decode_32_tok_s", row.get("served_tok_s", 0))
                        print(f"{number} | {system} | {row['file_bytes'] / 1e6:.0f} | "
                              f"{row.get('export_s', 0):.0f} | {' | '.join(cells)} | {batch:.0f}",
                              flush=True)  # fmt: skip
                    if "int4" in rows and "served-int4" in rows:
                        rows["served-int4"]["served_ceiling_tok_s"] = served_ceiling(rows["int4"])
                    rounds.append({"rows": rows, "goals": goals(rows)})
                    shown = {k: v and round(v, 2) for k, v in rounds[-1]["goals"].items()}
                    print("goals:", json.dumps(shown), flush=True)
            finally:
                for process, _ in urls.values():
                    process.terminate()
                    process.wait(60)
        report["shapes"][shape] = {"params": params, "rounds": rounds}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1, default=str))
    return report


if __name__ == "__main__":
    main()
