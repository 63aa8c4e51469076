"""Batching over HTTP, /metrics, the concurrency limit, timeouts, settings, logs, SIGTERM."""

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
from keras_attn_serving.cli import parse_settings
from keras_attn_serving.server import ModelRepository, create_app

from tests.serving.test_server import free_port, repository_folder, serve_in_thread, v2_request

pytestmark = pytest.mark.tf_only  # the artifact fixture exports with TensorFlow


@pytest.fixture(scope="module")
def root(toy_artifact, tmp_path_factory):
    return repository_folder(toy_artifact, tmp_path_factory.mktemp("repository"))


def ragged_requests(count, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(1, 40, (int(rng.integers(1, 4)), int(rng.integers(2, 20)))).tolist()
            for _ in range(count)]  # fmt: skip


def test_batched_answers_equal_one_request_at_a_time(root, toy_artifact):
    from keras_attn_serving import Predictor

    repository = ModelRepository(root, max_batch_size=16, workers=1)
    app = create_app(repository)
    _, _, batcher = repository.batcher("toy")
    assert batcher.sequence_inputs == {"token_ids"}  # padding verified safe for this model
    url, stop = serve_in_thread(app)
    try:
        requests = ragged_requests(60)
        with ThreadPoolExecutor(24) as pool:
            answers = list(pool.map(
                lambda ids: httpx.post(f"{url}/v2/models/toy/infer", json=v2_request(ids),
                                       timeout=30).json(), requests))  # fmt: skip
        direct = Predictor(toy_artifact[0])
        for ids, answer in zip(requests, answers, strict=True):
            (out,) = answer["outputs"]
            got = np.reshape(out["data"], out["shape"])
            np.testing.assert_allclose(got, direct.logits(np.array(ids, "int32")), atol=1e-4)
        text = httpx.get(f"{url}/metrics").text
        rows = sum(len(ids) for ids in requests)
        assert f'keras_attn_batch_size_sum{{model="toy"}} {float(rows)}' in text
        calls = float(text.split('keras_attn_batch_size_count{model="toy"} ')[1].split()[0])
        assert calls < len(requests)  # some requests were merged
        assert (
            'keras_attn_requests_total{route="/v2/models/{name}/infer",status="200"} 60.0' in text
        )
        assert "keras_attn_request_latency_seconds_bucket" in text
        assert "keras_attn_queue_depth" in text and "keras_attn_in_flight_requests" in text
        cap = float(text.split('keras_attn_batch_cap{model="toy"} ')[1].split()[0])
        assert cap in batcher.tuner.caps == [1, 2, 4, 8, 16]  # the cap the last batch had
        httpx.get(f"{url}/v2/models/nope")
        assert 'keras_attn_errors_total{route="/v2/models/{name}",status="404"} 1.0' in httpx.get(
            f"{url}/metrics").text  # fmt: skip
    finally:
        stop()


def test_concurrency_limit_answers_503_with_retry_after(root):
    repository = ModelRepository(root, max_batch_size=1)
    _, predictor, batcher = repository.batcher("toy")
    # Each run takes 0.2 s, so the 8 requests overlap however loaded the machine is.
    batcher._run = lambda feeds: (time.sleep(0.2), predictor.run_checked(feeds))[1]
    url, stop = serve_in_thread(create_app(repository, max_concurrency=1))
    try:
        with ThreadPoolExecutor(8) as pool:
            responses = list(pool.map(
                lambda _: httpx.post(f"{url}/v2/models/toy/infer", json=v2_request(), timeout=60),
                range(8)))  # fmt: skip
    finally:
        stop()
    busy = [r for r in responses if r.status_code == 503]
    assert busy and all(r.status_code in (200, 503) for r in responses)
    assert busy[0].headers["retry-after"] == "1" and "busy" in busy[0].json()["error"]


def test_request_timeout_answers_504(root):
    from fastapi.testclient import TestClient

    repository = ModelRepository(root)
    app = create_app(repository, request_timeout_s=0.2)
    _, predictor, batcher = repository.batcher("toy")
    batcher._run = lambda feeds: (time.sleep(1.0), predictor.run_checked(feeds))[1]  # slow
    with TestClient(app) as client:
        response = client.post("/v2/models/toy/infer", json=v2_request())
    assert response.status_code == 504 and "timed out after 0.2 s" in response.json()["error"]


def test_settings_from_flags_environment_and_defaults(root, monkeypatch):
    monkeypatch.setenv("KERAS_ATTN_PORT", "9123")
    monkeypatch.setenv("KERAS_ATTN_MAX_DELAY_MS", "2.5")
    settings = parse_settings(["--model-repository", str(root), "--max-batch-size", "4",
                               "--no-verify-sha256"])  # fmt: skip
    assert (settings.port, settings.max_batch_size, settings.max_delay_ms) == (9123, 4, 2.5)
    assert settings.verify_sha256 is False and settings.request_timeout_s == 30.0
    assert settings.batch_schedule == "length"
    with pytest.raises(SystemExit):
        parse_settings(["--model-repository", str(root), "--max-batch-size", "0"])
    with pytest.raises(SystemExit):
        parse_settings(["--model-repository", str(root), "--batch-schedule", "shortest"])
    flagged = parse_settings(["--model-repository", str(root), "--batch-schedule", "arrival"])
    assert flagged.batch_schedule == "arrival"
    (root / "toy" / "config.json").write_text(
        '{"max_batch_size": 3, "batch_schedule": "arrival", "batch_min_fill": 0.5}'
    )
    try:
        _, _, batcher = ModelRepository(root).batcher("toy")
        # per-model config.json overrides the server's
        assert (batcher.max_batch_size, batcher.schedule, batcher.min_fill) == (3, "arrival", 0.5)
        _, _, batcher = ModelRepository(root, batch_min_fill=0.7).batcher("toy")
        assert batcher.min_fill == 0.5  # config.json still wins
        (root / "toy" / "config.json").write_text('{"max_batch_size": 3}')
        _, _, batcher = ModelRepository(root, batch_min_fill=0.7).batcher("toy")
        assert (batcher.schedule, batcher.min_fill) == ("length", 0.7)
        assert ModelRepository(root, batch_schedule="arrival").batching["schedule"] == "arrival"
        (root / "toy" / "config.json").write_text('{"max_batch": 3}')
        with pytest.raises(Exception, match="max_batch"):
            ModelRepository(root).batcher("toy")
    finally:
        (root / "toy" / "config.json").unlink()


def test_logs_are_json_lines_with_fields():
    from keras_attn_serving.observability import JsonFormatter

    record = logging.LogRecord("keras_attn.serve", logging.INFO, __file__, 1, "request",
                               None, None)  # fmt: skip
    record.status, record.path = 200, "/v2"
    entry = json.loads(JsonFormatter().format(record))
    assert entry["message"] == "request" and entry["status"] == 200 and entry["path"] == "/v2"
    assert entry["level"] == "info" and entry["ts"].endswith("Z")


def test_sigterm_drains_in_flight_requests_then_exits(root):
    port = free_port()
    env = {**os.environ, "KERAS_ATTN_MODEL_REPOSITORY": str(root), "KERAS_ATTN_PORT": str(port)}
    command = [sys.executable, "-m", "keras_attn_serving", "--max-batch-size", "1",
               "--batch-workers", "1"]  # fmt: skip
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(url + "/v2/models/toy/ready").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.05)
        big = v2_request(np.ones((64, 24), "int64").tolist())

        stop = threading.Event()

        def post(_):
            # Posts until the signal, so requests are always queued when it comes.
            answers = []
            while not stop.is_set():
                try:
                    response = httpx.post(f"{url}/v2/models/toy/infer", json=big, timeout=60)
                    answers.append((response.status_code, time.monotonic()))
                except httpx.TransportError:
                    # Refused, or reset while still in the listen backlog: never started, so
                    # a client retries it. Only requests the server had taken must finish.
                    answers.append(("not started", time.monotonic()))
            return answers

        def in_flight():
            text = httpx.get(f"{url}/metrics").text
            return float(text.split("\nkeras_attn_in_flight_requests ")[1].split()[0])

        with ThreadPoolExecutor(8) as pool:
            pending = [pool.submit(post, i) for i in range(8)]
            for _ in range(1000):
                busy = in_flight()
                if busy >= 2:
                    break
                time.sleep(0.01)
            signalled = time.monotonic()
            process.send_signal(signal.SIGTERM)
            stop.set()
            answers = [answer for f in pending for answer in f.result()]
        # uvicorn re-raises the SIGTERM it caught once the drain is done.
        _, stderr = process.communicate(timeout=60)
        assert process.returncode in (0, -signal.SIGTERM)
    finally:
        process.kill()
        process.communicate()
    assert {status for status, _ in answers} <= {200, "not started"}
    # Every request in flight at the signal was answered, not cut off.
    assert busy >= 2
    assert sum(status == 200 and done > signalled for status, done in answers) >= 1
    logs = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    assert any(e["message"] == "drained" for e in logs)
    assert any(e["message"] == "request" and e.get("status") == 200 for e in logs)


@pytest.mark.parametrize("workers,num_threads", [(1, None), (2, None), (2, 3)])
def test_session_threads_default_to_the_cores_shared_among_the_workers(root, workers, num_threads):
    # Each batch worker runs its own onnxruntime call: together their threads fill the cores.
    cores = len(os.sched_getaffinity(0))
    _, predictor, _ = ModelRepository(root, num_threads=num_threads, workers=workers).batcher("toy")
    expected = num_threads or max(1, cores // workers)
    assert predictor.session.get_session_options().intra_op_num_threads == expected


def test_the_command_line_names_what_is_wrong_with_the_repository(tmp_path, capsys, monkeypatch):
    """Issue 41 item 13: no repository gave a pydantic dump, a missing one a traceback, and
    one artifact folder a server answering 503 with no hint."""
    monkeypatch.delenv("KERAS_ATTN_MODEL_REPOSITORY", raising=False)
    (tmp_path / "artifact").mkdir()
    (tmp_path / "artifact" / "manifest.json").write_text("{}")
    from keras_attn_serving.cli import main

    cases = [
        ([], "--model-repository is required (or KERAS_ATTN_MODEL_REPOSITORY)"),
        (["--model-repository", str(tmp_path / "nope")], "no such folder"),
        (["--model-repository", str(tmp_path / "artifact")], "mkdir -p REPO/NAME && mv"),
        (["--model-repository", str(tmp_path), "--max-delay-ms", "inf"], "--max-delay-ms: "),
    ]
    for argv, words in cases:
        with pytest.raises(SystemExit) as exit_:
            main(argv)  # stops before a server starts
        err = capsys.readouterr().err + str(exit_.value.code)
        assert words in err, err
        assert "pydantic" not in err and "Traceback" not in err and "errors.pydantic" not in err
