"""Benchmark: `/generate_stream` with iteration-level batching vs each request decoding alone.

    python bench/serve_generate.py                 # 1, 8, 32 streams; 3 rounds
    python bench/serve_generate.py --streams 1 8 --rounds 1 --new-tokens 16   # quicker

Writes a Llama-layout folder of RANDOM weights (`--dim`, `--layers`, 8 heads over 2 key/value
heads, SwiGLU, RMSNorm, rotary; a byte-level BPE learned from the embedded Shakespeare),
loads it with `CausalLM.from_pretrained`, exports it (`decode_gqa.onnx`), and starts
`keras-attn-serve` twice in its own processes on loopback: `--max-decode-rows 32` (requests
share each decode step) and `--max-decode-rows 0` (each request decodes alone, in its own
thread, as before). For each number of concurrent streams, each client sends requests one
after another (prompts of 4-40 tokens, `--new-tokens` new ones each, greedy, no stop) for
`--seconds`; rounds alternate the two servers. Prints tokens/s (new tokens over the window)
and time to first token p50/p99 per mode and stream count, the batched/alone ratio, and the
CPU flags; writes JSON. Loopback only; clients share the machine's cores with the server.
"""

import argparse
import asyncio
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Run as a script, this file's folder leads sys.path, and bench/export.py would shadow the
# `export` package; the repository root gives `examples.toy_checkpoints`.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))

import numpy as np  # noqa: E402


def write_model(work: Path, args) -> list[str]:
    """The toy Llama folder, its export as `work/repo/llm/1`; returns prompt texts."""
    import keras
    from keras_attn_export import export_model

    from examples.toy_checkpoints import learn_bpe
    from keras_attn.data import load_corpus
    from keras_attn.models import CausalLM, DecoderBackbone
    from keras_attn.tokenizers import from_tokenizer_json

    lines = load_corpus().lines()[:4000]
    folder = work / "toy-llama"
    folder.mkdir(parents=True)
    learn_bpe(lines, args.vocabulary_size, llama3=True).save(str(folder / "tokenizer.json"))
    tokenizer = from_tokenizer_json(folder / "tokenizer.json")
    keras.utils.set_random_seed(0)
    DecoderBackbone(
        tokenizer.vocabulary_size(), args.max_length, hidden_dim=args.dim,
        num_layers=args.layers, num_heads=8, num_key_value_heads=2,
        intermediate_dim=int(2.75 * args.dim), dropout=0.0, normalize_first=True,
        activation="swish", position_encoding="rotary", mask_zero=False,
        normalization="rms_norm", gated_feed_forward=True, attention_bias=False,
        attention_output_bias=False, feed_forward_bias=False, tie_word_embeddings=False,
        layer_norm_epsilon=1e-6,
    ).save_pretrained(folder, model_type="llama")  # fmt: skip
    lm = CausalLM.from_pretrained(folder)
    manifest = export_model(lm, work / "repo" / "llm" / "1", tokenizer=tokenizer,
                            formats=["onnx"], verbose=False)  # fmt: skip
    assert manifest["decoding"]["gqa"]["file"] == "decode_gqa.onnx", manifest["decoding"]
    rng = np.random.default_rng(0)
    prompts = []
    while len(prompts) < 64:
        start = int(rng.integers(0, len(lines) - 8))
        ids = tokenizer.tokenize(" ".join(lines[start : start + 8])).numpy()
        prompts.append(tokenizer.detokenize(ids[: int(rng.integers(4, 41))]).numpy().decode())
    return prompts


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(repository: Path, decode_rows: int):
    import httpx

    port = free_port()
    env = {**os.environ, "KERAS_ATTN_MODEL_REPOSITORY": str(repository),
           "KERAS_ATTN_PORT": str(port), "KERAS_ATTN_MAX_DECODE_ROWS": str(decode_rows),
           "KERAS_ATTN_LOG_LEVEL": "warning", "KERAS_ATTN_REQUEST_TIMEOUT_S": "600"}  # fmt: skip
    process = subprocess.Popen([sys.executable, "-m", "keras_attn_serving"], env=env)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{url}/v2/models/llm/ready").status_code == 200:
                return process, url
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    process.kill()
    raise RuntimeError("the server did not start")


async def streams(url: str, prompts: list[str], clients: int, new_tokens: int, seconds: float):
    """`clients` concurrent streaming clients for `seconds`: `(new tokens, [ttft s], wall s)`."""
    import aiohttp

    stream_url = f"{url}/v2/models/llm/generate_stream"
    tokens, first_token_s, errors = 0, [], 0
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def one(prompt: str) -> None:
            nonlocal tokens, errors
            body = {"text_input": prompt, "parameters": {"max_new_tokens": new_tokens}}
            sent = time.perf_counter()
            first = None
            async with session.post(stream_url, json=body) as response:
                if response.status != 200:
                    errors += 1
                    await response.read()
                    return
                async for line in response.content:
                    if line.startswith(b"data: "):
                        first = first or time.perf_counter()
                        tokens += 1
            if first is not None:
                first_token_s.append(first - sent)

        await one(prompts[0])  # warm-up: loads the model and starts the decode loop
        tokens, first_token_s = 0, []
        deadline = time.perf_counter() + seconds
        start = time.perf_counter()

        async def client(k: int) -> None:
            i = k
            while time.perf_counter() < deadline:
                await one(prompts[i % len(prompts)])
                i += clients

        await asyncio.gather(*(client(k) for k in range(clients)))
        wall = time.perf_counter() - start
    return tokens, first_token_s, wall, errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocabulary-size", type=int, default=4000)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--out", default="bench/results/serve_generate.json")
    args = parser.parse_args()

    from keras_attn.hardware import cpu_flags

    work = Path(tempfile.mkdtemp())
    prompts = write_model(work, args)
    modes = {"batched": 32, "alone": 0}
    servers = {mode: start_server(work / "repo", rows) for mode, rows in modes.items()}
    runs = {(m, c): [] for m in modes for c in args.streams}
    try:
        for _ in range(args.rounds):
            for clients in args.streams:
                for mode, (_, url) in servers.items():
                    result = asyncio.run(streams(url, prompts, clients, args.new_tokens,
                                                 args.seconds))  # fmt: skip
                    runs[(mode, clients)].append(result)
    finally:
        for process, _ in servers.values():
            process.terminate()
            process.wait(60)
    shutil.rmtree(work, ignore_errors=True)

    rows = []
    for (mode, clients), results in runs.items():
        rates = [t / w for t, _, w, _ in results]
        ttft = [s for _, firsts, _, _ in results for s in firsts]
        rows.append({"mode": mode, "streams": clients, "tokens_per_s": statistics.median(rates),
                     "rounds_tokens_per_s": rates, "requests": len(ttft),
                     "errors": sum(e for *_, e in results),
                     "ttft_p50_ms": 1000 * statistics.median(ttft),
                     "ttft_p99_ms": 1000 * float(np.percentile(ttft, 99))})  # fmt: skip
    by = {(r["mode"], r["streams"]): r for r in rows}
    flags = [f for f in cpu_flags() if f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16",
                                              "amx_tile", "amx_bf16", "amx_int8")]  # fmt: skip
    print(
        f"toy Llama layout: d {args.dim}, {args.layers} layers, 8 heads / 2 kv, vocab "
        f"{args.vocabulary_size}; {args.new_tokens} new tokens per request; "
        f"{os.cpu_count()} CPUs ({' '.join(flags)}); clients on the same machine"
    )
    print(f"{'mode':<9}{'streams':>8}{'requests':>9}{'errors':>7}{'tokens/s':>10}"
          f"{'ttft p50':>10}{'ttft p99':>10}{'vs alone':>9}{'p99/1-stream':>13}")  # fmt: skip
    single = {m: by[(m, min(args.streams))]["ttft_p99_ms"] for m in modes}
    for r in sorted(rows, key=lambda r: (r["streams"], r["mode"])):
        ratio = r["tokens_per_s"] / by[("alone", r["streams"])]["tokens_per_s"]
        r["vs_alone"] = ratio
        r["ttft_p99_vs_single_stream"] = r["ttft_p99_ms"] / single[r["mode"]]
        print(f"{r['mode']:<9}{r['streams']:>8}{r['requests']:>9}{r['errors']:>7}"
              f"{r['tokens_per_s']:>10.1f}{r['ttft_p50_ms']:>10.1f}{r['ttft_p99_ms']:>10.1f}"
              f"{ratio:>9.2f}{r['ttft_p99_vs_single_stream']:>13.2f}")  # fmt: skip
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"benchmark": "generate_stream: iteration-level batching vs alone",
                   "config": vars(args), "rows": rows,
                   "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                               "flags": flags}}, f, indent=2)  # fmt: skip
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
