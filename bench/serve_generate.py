"""Benchmark: `/generate_stream` with iteration-level batching vs each request decoding alone.

    python bench/serve_generate.py                 # 1, 8, 32 streams; 3 rounds
    python bench/serve_generate.py --streams 1 8 --rounds 1 --new-tokens 16   # quicker

Writes a Llama-layout folder of RANDOM weights (`--dim`, `--layers`, 8 heads over 2 key/value
heads, SwiGLU, RMSNorm, rotary; a byte-level BPE learned from the embedded Shakespeare),
loads it with `CausalLM.from_pretrained`, exports it (`decode_gqa.onnx`), and starts
`keras-attn-serve` twice in its own processes on loopback: `--max-decode-rows 32` (requests
share each decode step) and `--max-decode-rows 0` (each request decodes alone, in its own
thread, as before). For each number of concurrent streams, each client sends requests one
after another (prompts of 4-40 tokens, `--new-tokens` new ones each — with `--spread s` a
number drawn in `new-tokens × [1 - s, 1 + s]`, the same for every mode — greedy, no stop) for
`--seconds`; rounds alternate the two servers. Prints tokens/s (new tokens over the window)
and time to first token p50/p99 per mode and stream count, the batched/alone ratio, and the
CPU flags; writes JSON. Loopback only; clients share the machine's cores with the server.

With the bench extra installed (`pip install -e '.[bench]'`: torch, transformers and
onnxruntime-genai), the same folder also goes through onnxruntime-genai's model builder
(fp32, CPU) and runs in-process, with no HTTP, as the peer ("genai": its `Engine`, a static
batch of as many requests as streams; on CPU its continuous batching needs a PagedAttention
model, which the builder writes for CUDA only). Last, the raw onnxruntime time of one
`decode_gqa.onnx` step for 1 and 32 rows and of one prefill: the ceiling on tokens/s and the
floor on time to first token that no server on this machine gets past.
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
from typing import Any

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
    lm = CausalLM.from_pretrained(folder, preprocessor=None)  # ids; the tokenizer to export
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


def raw_ceiling(folder: Path, prompt_tokens: int, rows: int, prompts: list[str],
                repeats: int = 30) -> dict:  # fmt: skip
    """What onnxruntime alone allows on this machine, with no server, HTTP or sampling: the
    median time of one `decode_gqa.onnx` step for 1 and for `rows` rows (cache half full), and
    of one prefill of `prompt_tokens` ids. Bounds the served figures from above (tokens/s) and
    below (a request that arrives as a full step starts waits for it, then for its prefill).
    Also the prefill of the first `rows` prompts (shortest first, `PREFILL_ROWS` to a run, as
    the server does): the earliest the last request of `rows` sent at once can have its first
    token — the bench's clients all start together, and, asking for the same number of new
    tokens, tend to finish and come back together."""
    import onnxruntime as ort
    from keras_attn_serving.generation import BucketedCache
    from keras_attn_serving.manifest import read_manifest
    from keras_attn_serving.shared_steps import PREFILL_ROWS
    from keras_attn_serving.tokenizer import load_text_tokenizer

    manifest = read_manifest(folder)
    spec = manifest.decoding.gqa.model_dump()
    session = ort.InferenceSession(str(folder / spec["file"]), providers=["CPUExecutionProvider"])
    cache = BucketedCache(session, spec, rows)
    position = spec["max_length"] // 2

    def timed(size: int, tokens: int, index: int, runs: int = repeats) -> float:
        binding = cache.bindings[cache.bucket(size)]
        binding.bind_cpu_input("token_ids", np.ones((cache.bucket(size), tokens), np.int32))
        binding.bind_cpu_input("index", np.full(cache.bucket(size), index, np.int32))
        times = []
        for _ in range(runs + 3):
            start = time.perf_counter()
            session.run_with_iobinding(binding)
            times.append(time.perf_counter() - start)
        return 1000 * statistics.median(times[3:])

    lengths = sorted(map(len, load_text_tokenizer(folder / manifest.tokenizer).encode(
        [prompts[k % len(prompts)] for k in range(rows)])))  # fmt: skip
    chunks = [lengths[k : k + PREFILL_ROWS] for k in range(0, rows, PREFILL_ROWS)]
    return {"step_1_row_ms": timed(1, 1, position),
            f"step_{rows}_rows_ms": timed(rows, 1, position),
            "prefill_ms": timed(1, prompt_tokens, 0), "prompt_tokens": prompt_tokens,
            "burst_prefill_ms": sum(timed(len(c), max(c), 0, 5) for c in chunks),
            "burst_prompt_tokens": sum(lengths)}  # fmt: skip


def build_genai(work: Path) -> Path | None:
    """The toy folder through onnxruntime-genai's model builder (fp32, CPU); None (and why)
    when the bench extra is not installed."""
    try:
        import onnxruntime_genai  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as error:
        print(f"onnxruntime-genai not compared: {error} (pip install -e '.[bench]')")
        return None
    out = work / "genai"
    subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i",
                    str(work / "toy-llama"), "-o", str(out), "-p", "fp32", "-e", "cpu",
                    "-c", str(work / "genai-cache")], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    return out


def new_tokens_for(request: int, new_tokens: int, spread: float) -> int:
    """How many new ids request number `request` asks for: `new_tokens`, or with `spread`
    a draw in `new_tokens × [1 - spread, 1 + spread]`, the same for every mode."""
    if not spread:
        return new_tokens
    draw = np.random.default_rng(request).uniform(1 - spread, 1 + spread)
    return max(1, round(new_tokens * draw))


def genai_streams(folder: Path, prompts: list[str], clients: int, new_tokens: int,
                  seconds: float, spread: float = 0.0,
                  ) -> tuple[int, list[float], float, int]:  # fmt: skip
    """onnxruntime-genai in-process (no HTTP), greedy: its `Engine` with a static batch of
    `clients` requests (on CPU its continuous-batching scheduler needs a PagedAttention model,
    which the builder writes for CUDA only), each finished request replaced by the next
    prompt at once. Every request makes exactly its `new_tokens_for` ids. Returns as
    `streams`."""
    import onnxruntime_genai as og

    config_file = folder / "genai_config.json"
    config = json.loads(config_file.read_text())
    config["engine"] = {"static_batching": {"max_batch_size": clients}}
    config_file.write_text(json.dumps(config))
    model = og.Model(str(folder))
    tokenizer = og.Tokenizer(model)
    ids = [np.asarray(tokenizer.encode(p), np.int32) for p in prompts]
    engine = og.Engine(model)
    events = engine.create_event_buffer(4096)
    sent: dict[int, float] = {}
    first: list[float] = []
    tokens = 0
    count = 0

    def submit() -> None:
        nonlocal count
        request = engine.create_request()
        options = og.TurnOptions(request)
        options.set_do_sample(False)
        wanted = new_tokens_for(count, new_tokens, spread)
        options.set_min_generated_tokens(wanted)
        options.set_max_generated_tokens(wanted)
        request.begin_turn(ids[count % len(ids)], options)
        sent[id(request)] = time.perf_counter()
        live[id(request)] = request
        count += 1

    live: dict[int, Any] = {}
    for _ in range(clients):
        submit()
    start = time.perf_counter()
    deadline = start + seconds
    while engine.has_pending_requests():
        for event in engine.run(events):
            key = id(event.request)
            if event.flags & og.EngineEventFlags.TOKEN:
                tokens += 1
                if key in sent:
                    first.append(time.perf_counter() - sent.pop(key))
            if event.flags & og.EngineEventFlags.TURN_FINISHED:
                live.pop(key, None)
                if time.perf_counter() < deadline:
                    submit()
    return tokens, first, time.perf_counter() - start, 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(repository: Path, max_decode_rows: int = 32, **settings: str):
    """`keras-attn-serve` in its own process on loopback (`settings`: more `KERAS_ATTN_*`
    variables, by lower-case name); `(process, url)` once `llm` is ready."""
    import httpx

    port = free_port()
    env = {**os.environ, "KERAS_ATTN_MODEL_REPOSITORY": str(repository),
           "KERAS_ATTN_PORT": str(port), "KERAS_ATTN_MAX_DECODE_ROWS": str(max_decode_rows),
           "KERAS_ATTN_LOG_LEVEL": "warning", "KERAS_ATTN_REQUEST_TIMEOUT_S": "600",
           **{f"KERAS_ATTN_{k.upper()}": v for k, v in settings.items()}}  # fmt: skip
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


async def streams(url: str, prompts: list[str], clients: int, new_tokens: int, seconds: float,
                  spread: float = 0.0):  # fmt: skip
    """`clients` concurrent streaming clients for `seconds`: `(new tokens, [ttft s], wall s)`."""
    import aiohttp

    stream_url = f"{url}/v2/models/llm/generate_stream"
    tokens, first_token_s, errors = 0, [], 0
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def one(prompt: str, request: int) -> None:
            nonlocal tokens, errors
            wanted = new_tokens_for(request, new_tokens, spread)
            body = {"text_input": prompt, "parameters": {"max_new_tokens": wanted}}
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

        await one(prompts[0], 0)  # warm-up: loads the model and starts the decode loop
        tokens, first_token_s = 0, []
        deadline = time.perf_counter() + seconds
        start = time.perf_counter()

        async def client(k: int) -> None:
            i = k
            while time.perf_counter() < deadline:
                await one(prompts[i % len(prompts)], i)
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
    parser.add_argument(
        "--spread",
        type=float,
        default=0.0,
        help="each request asks for new-tokens x U[1-s, 1+s] (0: exactly)",
    )
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocabulary-size", type=int, default=4000)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--out", default="bench/results/serve_generate.json")
    args = parser.parse_args()

    from keras_attn.hardware import cpu_flags

    work = Path(tempfile.mkdtemp())
    prompts = write_model(work, args)
    rows_max = max(args.streams)
    ceiling = raw_ceiling(work / "repo" / "llm" / "1", 22, rows_max, prompts)
    genai = build_genai(work)
    modes = {"batched": 32, "alone": 0}
    servers = {mode: start_server(work / "repo", rows) for mode, rows in modes.items()}
    runs = {(m, c): [] for m in [*modes, *(["genai"] if genai else [])] for c in args.streams}
    try:
        if genai:  # warm-up
            genai_streams(genai, prompts, 1, args.new_tokens, 1.0, args.spread)
        for _ in range(args.rounds):
            for clients in args.streams:
                for mode, (_, url) in servers.items():
                    result = asyncio.run(streams(url, prompts, clients, args.new_tokens,
                                                 args.seconds, args.spread))  # fmt: skip
                    runs[(mode, clients)].append(result)
                if genai:
                    peer = genai_streams(genai, prompts, clients, args.new_tokens,
                                         args.seconds, args.spread)  # fmt: skip
                    runs[("genai", clients)].append(peer)
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
        f"{args.vocabulary_size}; {args.new_tokens} new tokens per request"
        f"{f' (x U[{1 - args.spread:g}, {1 + args.spread:g}])' if args.spread else ''}; "
        f"{os.cpu_count()} CPUs ({' '.join(flags)}); clients on the same machine"
    )
    print("genai: onnxruntime-genai in-process (no HTTP), static batches of `streams`")
    print(f"{'mode':<9}{'streams':>8}{'requests':>9}{'errors':>7}{'tokens/s':>10}"
          f"{'ttft p50':>10}{'ttft p99':>10}{'vs alone':>9}{'vs genai':>9}"
          f"{'p99/1-stream':>13}")  # fmt: skip
    single = {m: by[(m, min(args.streams))]["ttft_p99_ms"] for m, _ in by}
    for r in sorted(rows, key=lambda r: (r["streams"], r["mode"])):
        ratio = r["tokens_per_s"] / by[("alone", r["streams"])]["tokens_per_s"]
        peer = by.get(("genai", r["streams"]))
        r["vs_alone"] = ratio
        r["vs_genai"] = r["tokens_per_s"] / peer["tokens_per_s"] if peer else None
        r["ttft_p99_vs_single_stream"] = r["ttft_p99_ms"] / single[r["mode"]]
        versus = "-" if r["vs_genai"] is None else f"{r['vs_genai']:.2f}"
        print(f"{r['mode']:<9}{r['streams']:>8}{r['requests']:>9}{r['errors']:>7}"
              f"{r['tokens_per_s']:>10.1f}{r['ttft_p50_ms']:>10.1f}{r['ttft_p99_ms']:>10.1f}"
              f"{ratio:>9.2f}{versus:>9}{r['ttft_p99_vs_single_stream']:>13.2f}")  # fmt: skip
    step, alone = ceiling[f"step_{rows_max}_rows_ms"], by[("alone", rows_max)]["tokens_per_s"]
    top = 1000 * rows_max / step
    print(
        f"raw onnxruntime, no server: step 1 row {ceiling['step_1_row_ms']:.2f} ms, "
        f"{rows_max} rows {step:.2f} ms, prefill of {ceiling['prompt_tokens']} ids "
        f"{ceiling['prefill_ms']:.2f} ms"
    )
    print(
        f"ceiling at {rows_max} streams: {top:.0f} tokens/s = {top / alone:.2f}x the alone "
        f"server; time-to-first-token floor for a request arriving as a full step starts: "
        f"{step + ceiling['prefill_ms']:.1f} ms = "
        f"{(step + ceiling['prefill_ms']) / single['batched']:.2f}x the 1-stream p99"
    )
    burst = ceiling["burst_prefill_ms"]
    print(
        f"{rows_max} requests at once (their {ceiling['burst_prompt_tokens']} prompt ids): the "
        f"last one's first token no earlier than {burst:.1f} ms of prefill = "
        f"{burst / single['batched']:.2f}x the 1-stream p99"
    )
    ceiling.update(ceiling_tokens_per_s=top, ceiling_vs_alone=top / alone)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"benchmark": "generate_stream: iteration-level batching vs alone",
                   "config": vars(args), "rows": rows, "raw_onnxruntime": ceiling,
                   "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                               "flags": flags}}, f, indent=2)  # fmt: skip
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
