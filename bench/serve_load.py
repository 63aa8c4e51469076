"""Benchmark: the HTTP server under N concurrent clients vs raw onnxruntime, same run.

    python bench/serve_load.py                       # 64 clients, 10,000 requests per mode
    python bench/serve_load.py --requests 2000       # quicker

Exports a classifier (default: the BERT-small shape of `bench/export.py`, 4 layers, d 256,
4 heads, ffn 1024, seq 128; `--layers 2 --dim 128 --ffn 512 --seq 32` is a tiny model whose
run is bounded by HTTP, not by the model). Starts `keras-attn-serve` twice in its own
processes on loopback, batching (up to 32 rows, or `--max-batch-size`; the server tunes its
cap below that) and not (1). In `--rounds` rounds it measures raw onnxruntime sequences/s
(one caller, onnxruntime's default threads) at several batch sizes, then sends each server
its share of the KServe v2 JSON requests (one sequence each) from `--clients` concurrent
clients (asyncio + aiohttp, in this process). Raw rates are medians over the rounds, and the
best batch's is the denominator; the servers' rounds are pooled. Prints throughput, p50/p99
latency and errors per mode, and the server's throughput as a fraction of raw onnxruntime;
writes JSON. Loopback only; bounded by the request count.
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

# Run as a script, this file's folder leads sys.path, and bench/export.py would shadow the
# `export` package.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import numpy as np  # noqa: E402


def export_classifier(folder, args):
    import keras
    from keras_attn_export import export_model

    from keras_attn.models import Encoder, SequenceClassifier

    keras.utils.set_random_seed(0)
    encoder = Encoder(2000, args.seq, hidden_dim=args.dim, num_layers=args.layers,
                      num_heads=args.heads, intermediate_dim=args.ffn, dropout=0.0,
                      num_segments=None)  # fmt: skip
    model = SequenceClassifier(encoder, 3, dropout=0.0)
    export_model(model, folder, formats=["onnx"], verbose=False)


def raw_throughput(folder, seq, batches, seconds):
    """Sequences/s of onnxruntime alone, per batch size (one caller, onnxruntime's threads)."""
    import onnxruntime as ort

    session = ort.InferenceSession(f"{folder}/model.onnx", providers=["CPUExecutionProvider"])
    rng, rates = np.random.default_rng(0), {}
    for batch in batches:
        feeds = {"token_ids": rng.integers(1, 2000, (batch, seq)).astype("int32")}
        session.run(None, feeds)
        count, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            session.run(None, feeds)
            count += batch
        rates[batch] = count / (time.perf_counter() - start)
    return rates


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(repository, max_batch_size, clients, session_threads=None):
    port = free_port()
    env = {**os.environ, "KERAS_ATTN_MODEL_REPOSITORY": str(repository),
           "KERAS_ATTN_PORT": str(port), "KERAS_ATTN_MAX_BATCH_SIZE": str(max_batch_size),
           "KERAS_ATTN_MAX_CONCURRENCY": str(max(256, 2 * clients)),
           "KERAS_ATTN_LOG_LEVEL": "warning"}  # fmt: skip
    if session_threads:
        env["KERAS_ATTN_SESSION_THREADS"] = str(session_threads)
    process = subprocess.Popen([sys.executable, "-m", "keras_attn_serving"], env=env)
    url = f"http://127.0.0.1:{port}"
    import httpx

    for _ in range(600):
        try:
            if httpx.get(f"{url}/v2/models/clf/ready").status_code == 200:
                return process, url
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    process.kill()
    raise RuntimeError("the server did not start")


async def load(url, clients, requests, seq):
    # aiohttp (installed with tritonclient[http]): the clients share this machine's cores
    # with the server, and aiohttp costs them several times less CPU per request than httpx.
    import aiohttp

    rng = np.random.default_rng(1)
    bodies = [json.dumps({"inputs": [{"name": "token_ids", "shape": [1, seq], "datatype": "INT32",
                                      "data": rng.integers(1, 2000, seq).tolist()}]}).encode()
              for _ in range(64)]  # fmt: skip
    latencies, errors, counter = [], 0, iter(range(requests))
    headers = {"Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector) as client:
        infer = f"{url}/v2/models/clf/infer"

        async def worker():
            nonlocal errors
            for i in counter:
                start = time.perf_counter()
                try:
                    async with client.post(infer, data=bodies[i % len(bodies)],
                                           headers=headers) as response:  # fmt: skip
                        await response.read()
                        ok = response.status == 200
                except aiohttp.ClientError:
                    ok = False
                latencies.append(time.perf_counter() - start)
                errors += not ok

        for _ in range(min(clients, 32)):  # warm-up: load the model, fill the pools
            async with client.post(infer, data=bodies[0], headers=headers) as response:
                await response.read()
        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        elapsed = time.perf_counter() - start
    return latencies, errors, elapsed


def batch_metrics(url):
    """`(cap, rows, batches)` from the server's `/metrics`: its current row cap and the rows
    and batches it has run so far."""
    import httpx

    found = {}
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        name, _, value = line.rpartition(" ")
        for metric in ("keras_attn_batch_cap", "keras_attn_batch_size_sum",
                       "keras_attn_batch_size_count"):  # fmt: skip
            if name.startswith(metric + "{"):
                found[metric] = float(value)
    return (found.get("keras_attn_batch_cap"), found.get("keras_attn_batch_size_sum", 0.0),
            found.get("keras_attn_batch_size_count", 0.0))  # fmt: skip


def summary(latencies, errors, seconds):
    return {"requests": len(latencies), "errors": errors, "seconds": seconds,
            "throughput": len(latencies) / seconds,
            "p50_ms": 1000 * statistics.median(latencies),
            "p99_ms": 1000 * float(np.percentile(latencies, 99))}  # fmt: skip


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--ffn", type=int, default=1024)
    parser.add_argument("--raw-seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument(
        "--max-batch-size",
        type=int,
        default=32,
        help="the batched server's (it tunes its cap below this under load)",
    )
    parser.add_argument(
        "--session-threads",
        type=int,
        default=None,
        help="the server's onnxruntime intra-op threads per session",
    )
    parser.add_argument("--out", default="bench/results/serve_load.json")
    args = parser.parse_args()

    work = tempfile.mkdtemp()
    export_classifier(f"{work}/clf/1", args)
    # Rounds alternate raw onnxruntime, the batched server and the unbatched one, each round
    # a share of the requests, so the minutes-long drifts of a shared machine hit all three
    # alike. Each batch size's raw rate is the median over rounds (the best of several noisy
    # windows would flatter the baseline); the servers' figures pool their rounds.
    batches = (1, 4, 8, 16, 32)
    modes = {"batched": args.max_batch_size, "unbatched": 1}
    servers = {m: start_server(work, b, args.clients, args.session_threads)
               for m, b in modes.items()}  # fmt: skip
    rounds, server_rounds, pooled = [], [], {m: ([], 0, 0.0) for m in modes}
    try:
        for r in range(args.rounds):
            raw_round = raw_throughput(f"{work}/clf/1", args.seq, batches, args.raw_seconds)
            rounds.append(raw_round)
            share = args.requests // args.rounds + (r < args.requests % args.rounds)
            detail = {"raw_best": max(raw_round.values())}
            for mode, (_, url) in servers.items():
                _, rows_before, batches_before = batch_metrics(url)
                latencies, errors, seconds = asyncio.run(load(url, args.clients, share, args.seq))
                before = pooled[mode]
                pooled[mode] = (before[0] + latencies, before[1] + errors, before[2] + seconds)
                cap, rows_after, batches_after = batch_metrics(url)
                detail[mode] = {"throughput": len(latencies) / seconds, "cap_after": cap,
                                "mean_rows": (rows_after - rows_before)
                                / max(1.0, batches_after - batches_before)}  # fmt: skip
            server_rounds.append(detail)
    finally:
        for process, _ in servers.values():
            process.terminate()
            process.wait(60)
    shutil.rmtree(work, ignore_errors=True)
    raw = {b: statistics.median(r[b] for r in rounds) for b in batches}
    best_batch = max(raw, key=raw.get)
    rows = []
    for mode, max_batch in modes.items():
        row = summary(*pooled[mode])
        row.update(mode=mode, clients=args.clients, max_batch_size=max_batch,
                   fraction_of_raw=row["throughput"] / raw[best_batch])  # fmt: skip
        rows.append(row)

    print(f"classifier: {args.layers} layers, d {args.dim}, {args.heads} heads, ffn {args.ffn}, "
          f"seq {args.seq}; {os.cpu_count()} CPUs; clients in the same machine")  # fmt: skip
    print(f"raw onnxruntime sequences/s by batch (median of {len(rounds)} rounds): "
          + ", ".join(f"{b}: {r:.0f}" for b, r in raw.items())
          + f" (best: batch {best_batch})")  # fmt: skip
    print(f"{'mode':<10}{'clients':>8}{'requests':>9}{'errors':>7}{'seq/s':>9}{'p50 ms':>9}"
          f"{'p99 ms':>9}{'p99/p50':>8}{'of raw':>8}")  # fmt: skip
    for r in rows:
        print(f"{r['mode']:<10}{r['clients']:>8}{r['requests']:>9}{r['errors']:>7}"
              f"{r['throughput']:>9.0f}{r['p50_ms']:>9.1f}{r['p99_ms']:>9.1f}"
              f"{r['p99_ms'] / r['p50_ms']:>8.2f}{r['fraction_of_raw']:>8.2f}")  # fmt: skip
    print("per round: raw best, then each mode's seq/s (rows per batch, cap after)")
    for i, d in enumerate(server_rounds):
        print(f"  round {i + 1}: raw {d['raw_best']:.0f}; " + "; ".join(
            f"{m} {d[m]['throughput']:.0f} ({d[m]['mean_rows']:.1f}, {d[m]['cap_after']:.0f})"
            for m in modes) + f"; batched/unbatched "
            f"{d['batched']['throughput'] / d['unbatched']['throughput']:.2f}")  # fmt: skip
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"benchmark": "keras-attn-serve under load vs raw onnxruntime",
                   "config": vars(args), "raw_sequences_per_s": raw, "raw_rounds": rounds,
                   "server_rounds": server_rounds,
                   "best_batch": best_batch,
                   "rows": rows, "machine": {"platform": platform.platform(),
                                             "cpus": os.cpu_count()}}, f, indent=2)  # fmt: skip
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
