"""Slow and hostile connections (issue 26): a deadline and a size cap for request headers, a
cap on open connections that makes room instead of refusing health checks, HEAD, and
internal errors counted. A real uvicorn server on loopback, over an empty repository (no
model needed)."""

import asyncio
import json
import socket
import time

import httpx
import pytest
from keras_attn_serving.server import ModelRepository, create_app

from tests.serving.test_server import serve_in_thread


@pytest.fixture
def serve(tmp_path):
    stops = []

    def start(**settings):
        app = create_app(ModelRepository(tmp_path), **settings)
        url, stop = serve_in_thread(app)
        stops.append(stop)
        host, port = url.removeprefix("http://").split(":")
        return url, (host, int(port)), app

    yield start
    for stop in stops:
        stop()


def answer_of(sock, timeout=5.0):
    """Everything the server writes until it closes the connection."""
    sock.settimeout(timeout)
    chunks = []
    while True:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, TimeoutError):
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


def test_headers_that_never_finish_are_cut_at_the_deadline(serve):
    """Before: a half-sent request held its connection for as long as the client liked."""
    _, address, _ = serve(header_timeout_s=0.5)
    with socket.create_connection(address) as silent, socket.create_connection(address) as slow:
        slow.sendall(b"GET /v2 HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        started = time.monotonic()
        answer = answer_of(slow, timeout=60)
        waited = time.monotonic() - started
        assert answer.startswith("HTTP/1.1 408"), answer[:200]
        assert "longer than 0.5 s" in json.loads(answer.split("\r\n\r\n", 1)[1])["error"]
        assert waited > 0.3  # not before the deadline; how long after depends on the machine
        assert answer_of(silent).startswith("HTTP/1.1 408")  # never sent a byte


def test_a_kept_alive_connection_gets_the_same_deadline_for_its_next_request(serve):
    _, address, _ = serve(header_timeout_s=0.5)
    with socket.create_connection(address) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        first = b""
        while not first.endswith(b"\r\n\r\n{}"):
            first += sock.recv(4096)
        assert first.startswith(b"HTTP/1.1 200"), first
        sock.sendall(b"GET /v2 HTTP/1.1\r\nHo")  # the next request, never finished
        assert answer_of(sock).startswith("HTTP/1.1 408")


def test_headers_past_the_limit_get_431_and_a_body_does_not_count(serve):
    """Before: a 1 MB header was accepted."""
    url, address, _ = serve(max_header_bytes=4096)
    with socket.create_connection(address) as sock:
        sock.sendall(b"GET /v2 HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20_000)
        answer = answer_of(sock)
    assert answer.startswith("HTTP/1.1 431"), answer[:200]
    assert "exceed 4096 bytes" in answer
    # Headers and a 100 KB body sent in one write: only the headers count.
    body = json.dumps({"inputs": [], "pad": "x" * 100_000}).encode()
    response = httpx.post(url + "/v2/models/nope/infer", content=body)
    assert response.status_code == 404, response.text
    headers = {f"x-h{i}": "v" * 60 for i in range(40)}  # ~2.7 KB: under the limit
    assert httpx.get(url + "/v2", headers=headers).status_code == 200


def test_past_the_connection_cap_the_longest_waiting_connection_makes_room(serve):
    """Before: 1,100 half-sent requests (under `ulimit -n 1024`) failed every health check
    for 20 s. Now health is answered and the oldest half-sent connections are closed."""
    url, address, _ = serve(max_connections=20, header_timeout_s=60)
    held = []
    try:
        for _ in range(50):
            sock = socket.create_connection(address)
            sock.sendall(b"GET /v2 HTTP/1.1\r\nHost: x\r\n")  # never finished
            held.append(sock)
        for _ in range(10):
            assert httpx.get(url + "/v2/health/live", timeout=5).status_code == 200
        closed = 0
        for sock in held:
            sock.settimeout(0.01)
            try:
                closed += sock.recv(1) == b""
            except TimeoutError:
                pass
            except ConnectionResetError:
                closed += 1
        assert closed >= 30  # the oldest ones; at most 20 stay open
        assert all(s.fileno() >= 0 for s in held[-5:])
    finally:
        for sock in held:
            sock.close()


def test_head_answers_get_routes_and_405_names_the_allowed_methods(serve):
    """Before: HEAD was 405 on every GET route, without `Allow`."""
    url, _, _ = serve()
    head = httpx.head(url + "/v2")
    assert head.status_code == 200 and head.content == b""
    assert int(head.headers["content-length"]) == len(httpx.get(url + "/v2").content)
    wrong = httpx.delete(url + "/v2/health/live")
    assert wrong.status_code == 405 and wrong.headers["allow"] == "GET"
    assert wrong.json() == {"error": "Method Not Allowed"}


def test_an_internal_error_is_counted_and_logged(serve, caplog):
    """Before: a 500 was missing from /metrics and from the request log."""
    url, _, app = serve()

    def broken():
        raise RuntimeError("boom at /secret/path")

    app.state.repository.index = broken
    with caplog.at_level("INFO", logger="keras_attn.serve"):
        response = httpx.post(url + "/v2/repository/index")
    assert response.status_code == 500 and response.json() == {"error": "internal error"}
    metrics = httpx.get(url + "/metrics").text
    assert 'keras_attn_errors_total{route="/v2/repository/index",status="500"} 1.0' in metrics
    logged = [r for r in caplog.records if r.getMessage() == "request"]
    assert any(r.status == 500 and r.path == "/v2/repository/index" for r in logged)


def test_a_body_left_unread_by_an_early_answer_is_not_taken_for_headers(serve):
    """An answer sent before its request's body was read (a 404 for an unknown model) left
    the rest of the body arriving on the kept-alive connection, counted as the next
    request's headers: the next request got a 431 (found by the fuzz suite)."""
    _, address, _ = serve(max_header_bytes=4096)
    rest = b"x" * 50_000
    with socket.create_connection(address) as sock:
        sock.sendall(b"POST /v2/models/nope/infer HTTP/1.1\r\nHost: x\r\nContent-Length: "
                     + str(10 + len(rest)).encode() + b"\r\n\r\n" + b'{"pad": "x')  # fmt: skip
        answer = b""
        while b'"error"' not in answer:
            answer += sock.recv(4096)
        assert answer.startswith(b"HTTP/1.1 404"), answer
        sock.sendall(rest)  # the body's rest, after its answer
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        following = b""
        while b"\r\n\r\n" not in following:
            following += sock.recv(4096)
    assert following.startswith(b"HTTP/1.1 200"), following


@pytest.fixture
def writes(monkeypatch):
    """What each answer wrote to its connection: `[[bytes, ...] per response]`."""
    from keras_attn_serving import connections

    recorded: list[list[bytes]] = []

    class Recorder:
        def __init__(self, transport, calls):
            self.transport, self.calls = transport, calls

        def write(self, data):
            self.calls.append(bytes(data))
            self.transport.write(data)

        def __getattr__(self, name):
            return getattr(self.transport, name)

    class Recorded(connections.OneWrite):
        def __init__(self, transport, cycle):
            recorded.append([])
            super().__init__(Recorder(transport, recorded[-1]), cycle)

    monkeypatch.setattr(connections, "OneWrite", Recorded)
    return recorded


def test_an_answer_of_known_length_is_one_write_with_its_headers(serve, writes):
    """Before: uvicorn wrote the status line and headers, then the body: two system calls and
    two loopback segments per answer, on cores onnxruntime keeps cold (issue 28)."""
    url, _, app = serve()
    from fastapi.responses import Response, StreamingResponse

    big = b"x" * 100_000

    async def chunks():
        yield b"first "
        await asyncio.sleep(0.05)
        yield b"second"

    app.add_api_route("/test/big", lambda: Response(big))
    app.add_api_route("/test/stream", lambda: StreamingResponse(chunks()))
    with httpx.Client() as client:  # one kept-alive connection for all
        assert client.get(url + "/v2").json()["name"] == "keras-attn-serve"
        missing = client.post(url + "/v2/models/nope/infer", content=b"{}")
        assert missing.status_code == 404
        head = client.head(url + "/v2")
        assert head.status_code == 200 and head.content == b""
        assert client.get(url + "/test/big").content == big
        assert client.get(url + "/test/stream").content == b"first second"
    start = len(writes) - 5
    (ok,), (refused,), (headers_only,), big_answer, streamed = writes[start:]
    for answer, body in ((ok, httpx.get(url + "/v2").content), (refused, missing.content)):
        head_part, _, rest = answer.partition(b"\r\n\r\n")
        assert head_part.startswith(b"HTTP/1.1 ") and rest == body
    assert headers_only.endswith(b"\r\n\r\n") and b"content-length" in headers_only
    # A body over 64 KiB follows its headers uncopied; a streamed one gets its headers first.
    assert [len(w) for w in big_answer[1:]] == [len(big)] and big_answer[0].endswith(b"\r\n\r\n")
    assert streamed[0].endswith(b"\r\n\r\n") and b"chunked" in streamed[0]
    assert b"first" in streamed[1] and b"second" in streamed[2]


def test_pipelined_requests_get_whole_answers_in_order(serve, writes):
    _, address, _ = serve()
    with socket.create_connection(address) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
                     b"GET /v2 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")  # fmt: skip
        answer = answer_of(sock)
    first, _, second = answer.partition("HTTP/1.1 200 OK\r\n")[2].partition("HTTP/1.1 200")
    assert first.endswith("\r\n\r\n{}") and second.endswith('"binary_tensor_data"]}')
    assert [len(calls) for calls in writes[-2:]] == [1, 1]


def test_a_client_that_never_reads_a_big_answer_is_counted_then_cut_off(serve):
    """Issue 41 item 6: an 8 MB answer to a client that reads nothing used to leave the
    request's count at once (the whole body sat in the transport's buffer, uncounted, for
    as long as the client liked). It now stays in flight, under --max-concurrency, until its
    bytes are out, and a client that reads nothing for send_timeout_s is cut off."""
    from fastapi.responses import Response

    url, address, app = serve(max_concurrency=1, send_timeout_s=1.0)
    app.add_api_route("/test/big", lambda: Response(b"x" * (8 << 20)))
    gauge = "keras_attn_in_flight_requests"
    with socket.create_connection(address) as silent:
        silent.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        silent.sendall(b"GET /test/big HTTP/1.1\r\nHost: x\r\n\r\n")
        held = None
        for _ in range(100):  # the answer is being written: one request in flight
            metrics = httpx.get(url + "/metrics").text
            if f"{gauge} 1.0" in metrics:
                held = httpx.get(url + "/test/big")
                break
            time.sleep(0.05)
        assert held is not None and held.status_code == 503, metrics
        cut = None
        for _ in range(200):  # cut off after about a second without a read
            if f"{gauge} 0.0" in httpx.get(url + "/metrics").text:
                cut = True
                break
            time.sleep(0.05)
        assert cut
        silent.settimeout(5)
        received = 0
        try:
            while chunk := silent.recv(1 << 20):
                received += len(chunk)
        except (ConnectionResetError, TimeoutError):
            pass
        assert received < 2 << 20  # what the buffers held; the rest was dropped (a reset)
    assert httpx.get(url + "/test/big").status_code == 200


def test_a_client_trickling_a_big_answer_is_cut_off_too(serve):
    """Reading a little now and then (each read resumes the writes for a moment) must not
    hold an answer and its request slot for as long as the client likes: under
    MIN_SEND_RATE over send_timeout_s, the connection is reset."""
    from fastapi.responses import Response

    _, address, app = serve(send_timeout_s=1.0)
    app.add_api_route("/test/big", lambda: Response(b"x" * (8 << 20)))
    with socket.create_connection(address) as trickle:
        trickle.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        trickle.sendall(b"GET /test/big HTTP/1.1\r\nHost: x\r\n\r\n")
        trickle.settimeout(5)
        received, reset = 0, False
        for _ in range(120):  # at most 60 s of 1 KiB every 0.5 s: 2 KiB/s, 120 KiB
            try:
                chunk = trickle.recv(1024)
            except (ConnectionResetError, TimeoutError):
                reset = True
                break
            if not chunk:
                reset = True
                break
            received += len(chunk)
            time.sleep(0.5)
        assert reset and received < 1 << 20, received
