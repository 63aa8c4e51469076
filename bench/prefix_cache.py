"""Benchmark: a chat workload with and without the prefix cache, same model, same run.

    python bench/prefix_cache.py                  # 16 clients, 3 rounds of 30 s per mode
    python bench/prefix_cache.py --seconds 10 --rounds 1   # quicker

Writes the toy Llama-layout folder of `bench/serve_generate.py` (RANDOM weights, `--dim`,
`--layers`, 8 heads over 2 key/value heads, a byte-level BPE learned from the embedded
Shakespeare) with room for `--max-length` positions, exports it (`decode_gqa.onnx`), and
starts `keras-attn-serve` twice on loopback: `--prefix-cache-bytes 0` and the default
(256 MiB). The workload is a chat service's: every request is one shared `--system-tokens`
system prompt followed by a user turn of 10-40 tokens (different each time), streamed from
`/v2/models/llm/generate_stream` for `--new-tokens` new tokens, by `--clients` concurrent
clients for `--seconds`; rounds alternate the two servers. Prints time to first token p50 and
p99 and tokens/s per mode, the ratios, and the CPU flags; writes JSON.
"""

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))

import numpy as np  # noqa: E402

from bench.serve_generate import start_server, write_model  # noqa: E402


def chat_prompts(work: Path, system_tokens: int, count: int) -> tuple[str, list[str]]:
    """`(system prompt, user turns)` as text: `system_tokens` tokens of the corpus, and
    `count` turns of 10-40 tokens."""
    from keras_attn.data import load_corpus
    from keras_attn.tokenizers import from_tokenizer_json

    tokenizer = from_tokenizer_json(work / "toy-llama" / "tokenizer.json")
    lines = load_corpus().lines()[4000:12000]
    ids = tokenizer.tokenize(" ".join(lines[:400])).numpy()
    system = tokenizer.detokenize(ids[:system_tokens]).numpy().decode()
    rng = np.random.default_rng(1)
    turns = []
    for _ in range(count):
        start = int(rng.integers(400, len(lines) - 8))
        turn = tokenizer.tokenize(" ".join(lines[start : start + 8])).numpy()
        turns.append(tokenizer.detokenize(turn[: int(rng.integers(10, 41))]).numpy().decode())
    return system, turns


async def chat(url: str, system: str, turns: list[str], clients: int, new_tokens: int,
               seconds: float) -> dict:  # fmt: skip
    """`clients` concurrent streaming clients for `seconds`: tokens, first-token times."""
    import httpx

    tokens, first_token_s, errors = 0, [], 0
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=64)) as http:

        async def one(turn: str) -> None:
            nonlocal tokens, errors
            body = {"text_input": f"{system} {turn}", "parameters": {"max_new_tokens": new_tokens}}
            sent, first = time.perf_counter(), None
            async with http.stream("POST", f"{url}/v2/models/llm/generate_stream",
                                   json=body) as response:  # fmt: skip
                if response.status_code != 200:
                    errors += 1
                    await response.aread()
                    return
                async for line in response.aiter_lines():
                    if line.startswith("data: "):
                        first = first or time.perf_counter()
                        tokens += 1
            if first is not None:
                first_token_s.append(first - sent)

        await one(turns[0])  # warm-up: loads the model, starts the loop (and fills the cache)
        tokens, first_token_s = 0, []
        deadline = time.perf_counter() + seconds
        began = time.perf_counter()

        async def client(k: int) -> None:
            i = k
            while time.perf_counter() < deadline:
                await one(turns[i % len(turns)])
                i += clients

        await asyncio.gather(*(client(k) for k in range(clients)))
        wall = time.perf_counter() - began
    return {"tokens_per_s": tokens / wall, "ttft_s": first_token_s, "errors": errors,
            "requests": len(first_token_s)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--system-tokens", type=int, default=400)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocabulary-size", type=int, default=4000)
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--out", default="bench/results/prefix_cache.json")
    args = parser.parse_args()

    from keras_attn.hardware import cpu_flags

    work = Path(tempfile.mkdtemp())
    write_model(work, args)
    system, turns = chat_prompts(work, args.system_tokens, 64)
    modes = {"no cache": 0, "prefix cache": 256 << 20}
    servers = {mode: start_server(work / "repo", prefix_cache_bytes=str(size))
               for mode, size in modes.items()}  # fmt: skip
    results: dict[str, list[dict]] = {mode: [] for mode in modes}
    try:
        for round_ in range(args.rounds):
            for mode, (_, url) in servers.items():
                got = asyncio.run(chat(url, system, turns, args.clients, args.new_tokens,
                                       args.seconds))  # fmt: skip
                results[mode].append(got)
                p50 = statistics.median(got["ttft_s"])
                print(f"round {round_ + 1} {mode:>12}: ttft p50 {1000 * p50:7.1f} ms, "
                      f"{got['tokens_per_s']:6.1f} tokens/s, {got['requests']} requests, "
                      f"{got['errors']} errors", flush=True)  # fmt: skip
    finally:
        for process, _ in servers.values():
            process.terminate()
            process.wait(30)
    flags = [f for f in cpu_flags() if f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16",
                                             "amx_tile", "amx_bf16", "amx_int8")]  # fmt: skip
    print(f"\nchat workload: {args.system_tokens}-token system prompt + 10-40-token turns, "
          f"{args.clients} clients, {args.new_tokens} new tokens, toy Llama d{args.dim} "
          f"x{args.layers}; {os.cpu_count()} CPUs ({' '.join(flags)}); clients on the same "
          "machine")  # fmt: skip
    print(f"{'round':>5} | {'mode':>12} | {'ttft p50 ms':>11} | {'ttft p99 ms':>11} | "
          f"{'tokens/s':>8}")  # fmt: skip
    summary = []
    for round_ in range(args.rounds):
        row = {}
        for mode in modes:
            got = results[mode][round_]
            ttft = np.array(got["ttft_s"]) * 1000
            row[mode] = {"ttft_p50_ms": float(np.percentile(ttft, 50)),
                         "ttft_p99_ms": float(np.percentile(ttft, 99)),
                         "tokens_per_s": got["tokens_per_s"], "requests": got["requests"],
                         "errors": got["errors"]}  # fmt: skip
            print(f"{round_ + 1:>5} | {mode:>12} | {row[mode]['ttft_p50_ms']:11.1f} | "
                  f"{row[mode]['ttft_p99_ms']:11.1f} | {got['tokens_per_s']:8.1f}")  # fmt: skip
        none, cached = row["no cache"], row["prefix cache"]
        row["ttft_p50_ratio"] = none["ttft_p50_ms"] / cached["ttft_p50_ms"]
        row["tokens_per_s_ratio"] = cached["tokens_per_s"] / none["tokens_per_s"]
        print(f"{'':>5}   ttft p50 {row['ttft_p50_ratio']:.1f}x lower with the cache, "
              f"tokens/s x{row['tokens_per_s_ratio']:.2f}")  # fmt: skip
        summary.append(row)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"benchmark": "prefix cache: chat workload", "args": vars(args),
                   "rounds": summary, "machine": {"platform": platform.platform(),
                                                  "cpus": os.cpu_count(), "flags": flags}},
                  f, indent=2)  # fmt: skip


if __name__ == "__main__":
    main()
