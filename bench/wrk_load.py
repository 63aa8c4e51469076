"""Load from `wrk` (Debian's `wrk` package, C, one epoll thread): the bench's clients at a
quarter of the CPU of aiohttp's, which matters where they share the server's cores.

`wrk_load(url, clients, requests)` replays `requests` (`(path, body, headers)`) once, in order,
over `clients` kept-alive connections (`wrk_replay.lua`), and returns what the bench's
aiohttp `load` returns, in one dict: answers, seconds (first request to last answer), p50/p99
seconds, errors (requests not answered 2xx) and wrk's CPU seconds.
"""

import json
import os
import resource
import shutil
import signal
import subprocess
import tempfile
import time

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "wrk_replay.lua")


def available() -> bool:
    return shutil.which("wrk") is not None


def raw_request(host: str, path: str, body: bytes, headers: dict) -> bytes:
    """One HTTP/1.1 POST as it goes on the wire."""
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}", f"Content-Length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def wrk_load(url: str, clients: int, requests: list, limit_s: int = 300) -> dict:
    host = url.removeprefix("http://").rstrip("/")
    with tempfile.TemporaryDirectory(prefix="wrk_") as work:
        listing = os.path.join(work, "requests.bin")
        with open(listing, "wb") as f:
            for path, body, headers in requests:
                raw = raw_request(host, path, body, headers)
                f.write(b"%d\n" % len(raw) + raw)
        # -d bounds the run: without its "end" (a server that stopped answering) wrk exits
        # then, and this raises.
        command = ["wrk", "-t1", f"-c{clients}", f"-d{limit_s}s", "--timeout", "120s",
                   "-s", SCRIPT, url, "--", listing]  # fmt: skip
        before = resource.getrusage(resource.RUSAGE_CHILDREN)  # reaped children: wrk alone
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        marks = {}
        try:
            for line in process.stdout:  # "start", "end": the first request, the last answer
                word = line.strip().decode()
                if word in ("start", "end"):
                    marks[word] = time.perf_counter()
                    if word == "end":
                        process.send_signal(signal.SIGINT)  # its summary follows
                        break
            out, err = process.communicate()
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    lines = [line for line in out.decode().splitlines() if line.startswith('{"wrk"')]
    if process.returncode != 0 or not lines or len(marks) != 2:
        raise RuntimeError(f"wrk failed ({process.returncode}): {err.decode()[-500:]}")
    result = json.loads(lines[-1])
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"requests": result["answers"], "seconds": marks["end"] - marks["start"],
            "p50_s": result["p50_us"] / 1e6, "p99_s": result["p99_us"] / 1e6,
            "errors": result["errors"], "cpu_s": cpu}  # fmt: skip
