"""What every route shares: the concurrency gate, the body and size limits, the error answers
(always `{"error": ...}`, never a path, address or traceback), and the call through a model's
batcher within the request timeout. Routes read the repository and settings from
`request.app.state`."""

import asyncio
import logging
import math
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from keras_attn_serving.predictor import InputError
from keras_attn_serving.protocol import ServingError, bounded, error_body, parse_json, shown

if TYPE_CHECKING:
    import numpy as np
    from fastapi import FastAPI, Request
    from keras_attn_serving.batching import Batcher
    from keras_attn_serving.observability import Metrics
    from keras_attn_serving.predictor import Predictor
    from keras_attn_serving.settings import ServerSettings
    from starlette.responses import Response
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("keras_attn.serve")


class Direct(NamedTuple):
    """A route the `Gate` answers itself, without FastAPI's routing, dependency solving and
    exception middleware (about a quarter of the event loop's time per request on the v2
    `infer` route): `endpoint(request, **parameters)` returns a `Response`, and any error it
    raises is answered as the app's exception handlers answer it. The parameters are the
    path's, and the `query` names the path lacks, from the query string (as FastAPI reads
    an endpoint's other parameters)."""

    method: str
    template: str  # the route's path as FastAPI names it (the metrics label)
    pattern: "re.Pattern[str]"
    endpoint: "Callable[..., Awaitable[Response]]"
    query: tuple[str, ...]


def direct(
    method: str,
    template: str,
    endpoint: "Callable[..., Awaitable[Response]]",
    query: Sequence[str] = (),
) -> Direct:
    """`template`'s `{parameter}`s each match one path segment, as in FastAPI."""
    parts = re.split(r"\{(\w+)\}", template)  # literal, name, literal, ...
    pattern = "".join(
        f"(?P<{part}>[^/]+)" if k % 2 else re.escape(part) for k, part in enumerate(parts)
    )
    path_names = set(parts[1::2])
    return Direct(
        method, template, re.compile(pattern), endpoint,
        tuple(name for name in query if name not in path_names),
    )  # fmt: skip


class Gate:
    """ASGI middleware around every route: the concurrency limit (503 + Retry-After), metrics
    and one JSON log line per request; and the `direct` routes, answered here. (Plain ASGI:
    Starlette's `BaseHTTPMiddleware` costs about a millisecond per request.)"""

    UNLIMITED = ("/metrics", "/v2/health/live", "/v2/health/ready")
    SLICE_ABOVE, SLICE_BYTES = 1 << 20, 256 << 10  # bodies past 1 MiB go out in 256 KiB

    def __init__(
        self,
        app: "ASGIApp",
        settings: "ServerSettings",
        metrics: "Metrics",
        log: logging.Logger,
        direct: Sequence[Direct] = (),
    ) -> None:
        self.app, self.settings, self.metrics, self.log = app, settings, metrics, log
        self.direct = tuple(direct)
        self.in_flight = 0

    def _direct(self, scope: "Scope") -> tuple[Direct, dict[str, str]] | None:
        path, root = scope["path"], scope.get("root_path", "")
        if root and path.startswith(root):  # mounted, or `--root-path`: routes see the rest
            path = path[len(root) :]
        for route in self.direct:
            if scope["method"] == route.method:
                match = route.pattern.fullmatch(path)
                if match is not None:
                    return route, match.groupdict()
        return None

    async def _answer(
        self, route: Direct, params: dict[str, str], scope: "Scope", receive: "Receive",
        send: "Send",
    ) -> None:  # fmt: skip
        from starlette.requests import Request

        request = Request(scope, receive)
        if route.query and scope["query_string"]:
            given = request.query_params
            params = {**params, **{name: given[name] for name in route.query if name in given}}
        try:
            response = await route.endpoint(request, **params)
        except Exception as error:
            response = error_response(request, error)
        await response(scope, receive, send)

    async def __call__(self, scope: "Scope", receive: "Receive", send: "Send") -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path, started, status = scope["path"], time.perf_counter(), [500]
        limited = path not in self.UNLIMITED
        app_scope = scope
        if scope["method"] == "HEAD":
            # Routed as the GET it stands for; uvicorn, which still sees HEAD, sends the
            # headers without the body.
            app_scope = {**scope, "method": "GET"}

        begun = [False]  # the response has started: an error can no longer be answered

        async def record_status(message: "Message") -> None:
            if message["type"] == "http.response.start":
                status[0], begun[0] = message["status"], True
            body = message.get("body", b"")
            if message["type"] != "http.response.body" or len(body) <= self.SLICE_ABOVE:
                return await send(message)
            # A large body in slices: each waits for the socket (uvicorn's flow control), so
            # the request stays in flight, under --max-concurrency, until its bytes are out.
            view, more = memoryview(body), message.get("more_body", False)
            for start in range(0, len(view), self.SLICE_BYTES):
                end = start + self.SLICE_BYTES
                await send({"type": "http.response.body", "body": bytes(view[start:end]),
                            "more_body": more or end < len(view)})  # fmt: skip

        direct = self._direct(scope) if self.direct else None
        answered: str | None = None  # the direct route's name, once it answers (not a 503)
        try:
            if limited and self.in_flight >= self.settings.max_concurrency:
                from starlette.responses import JSONResponse

                busy = JSONResponse(
                    error_body(path, f"server busy: {self.settings.max_concurrency} requests "
                                     "in flight", 503),
                    status_code=503, headers={"Retry-After": "1"},
                )  # fmt: skip
                await busy(scope, receive, record_status)
            else:
                self.in_flight += limited
                self.metrics.in_flight.set(self.in_flight)
                try:
                    if direct is None:
                        await self.app(app_scope, receive, record_status)
                    else:
                        answered = direct[0].template
                        await self._answer(*direct, scope, receive, record_status)
                except (Exception, asyncio.CancelledError, KeyboardInterrupt, SystemExit):
                    raise
                except BaseException as error:  # a native library's panic (pyo3)
                    if begun[0]:
                        raise
                    await _internal_error(scope, receive, record_status, error)
                finally:
                    self.in_flight -= limited
                    self.metrics.in_flight.set(self.in_flight)
        finally:
            # Also when the route raised (the 500 is written outside this middleware): an
            # internal error is counted and logged like any answer.
            seconds = time.perf_counter() - started
            route = answered or str(getattr(app_scope.get("route"), "path", "unmatched"))
            self.metrics.observe(route, status[0], seconds)
            if self.log.isEnabledFor(logging.INFO):
                self.log.info("request", extra={"method": scope["method"], "path": path,
                                                "status": status[0],
                                                "ms": round(1000 * seconds, 3)})  # fmt: skip


async def _internal_error(scope: "Scope", receive: "Receive", send: "Send", error: BaseException
                          ) -> None:  # fmt: skip
    """A JSON 500 for an error that escaped every `except Exception` (uvicorn would send a
    plain-text one)."""
    from starlette.requests import Request

    await error_response(Request(scope, receive), RuntimeError(type(error).__name__))(
        scope, receive, send
    )


def error_response(request: "Request", error: Exception) -> "Response":
    """The answer to a route's `error`: `{"error": message}` with its status; an unexpected
    error is logged and answered 500 without its details."""
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException

    path = request.url.path
    if isinstance(error, ServingError):
        body = error_body(path, error.message, error.status, error.param, error.code)
        return JSONResponse(body, status_code=error.status)
    if isinstance(error, InputError):
        return JSONResponse(error_body(path, bounded(str(error)), 400), status_code=400)
    if isinstance(error, HTTPException):  # 405 keeps its `Allow` header
        return JSONResponse(error_body(path, str(error.detail), error.status_code),
                            status_code=error.status_code, headers=error.headers)  # fmt: skip
    if isinstance(error, RequestValidationError):
        message = f"invalid request: {error.errors()}"
        return JSONResponse(error_body(path, bounded(message), 400), status_code=400)
    # The details (paths, node names, addresses) go to the log, not to the client; the
    # connection is closed after a 500, and the client is told so.
    log.error("internal error on %s %s", request.method, path, exc_info=error)
    return JSONResponse(
        error_body(path, "internal error", 500), status_code=500, headers={"Connection": "close"}
    )


def install_error_handlers(app: "FastAPI") -> None:
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException

    async def handle(request: "Request", error: Exception) -> "Response":
        return error_response(request, error)  # (a plain function would run in a thread)

    for kind in (ServingError, InputError, HTTPException, RequestValidationError, Exception):
        app.add_exception_handler(kind, handle)


async def read_body(request: "Request") -> bytes:
    """The body, decompressed, refused with 413 once it passes `max_body_bytes`."""
    max_body_bytes = request.app.state.settings.max_body_bytes
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_body_bytes:
        raise ServingError(413, f"request body exceeds {max_body_bytes} bytes")
    # Counted while it arrives: a chunked body (no Content-Length) is refused once it
    # passes the limit, never read whole first; and it must arrive within the request
    # timeout (a body sent a byte at a time held its connection for as long as it liked).
    from starlette.requests import ClientDisconnect

    chunks: list[bytes] = []
    timeout = request.app.state.settings.request_timeout_s

    async def receive() -> None:
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_body_bytes:
                raise ServingError(413, f"request body exceeds {max_body_bytes} bytes")
            chunks.append(chunk)

    try:
        async with asyncio.timeout(timeout):  # (`wait_for` would start a task per request)
            await receive()
    except TimeoutError:
        raise ServingError(408, f"the request body took longer than {timeout:g} s") from None
    except ClientDisconnect:
        raise ServingError(400, "the client disconnected before sending the body") from None
    body = b"".join(chunks)
    encoding = request.headers.get("content-encoding", "identity").lower()
    if encoding in ("gzip", "deflate"):  # tritonclient's request_compression_algorithm
        import zlib

        try:
            body = zlib.decompressobj(wbits=47 if encoding == "gzip" else 15).decompress(
                body, max_body_bytes + 1
            )
        except zlib.error as error:
            raise ServingError(400, f"body is not valid {encoding}: {error}") from None
    elif encoding != "identity":
        raise ServingError(415, f"unsupported Content-Encoding {shown(encoding)}")
    if len(body) > max_body_bytes:
        raise ServingError(413, f"request body exceeds {max_body_bytes} bytes")
    return body


async def json_body(request: "Request") -> Any:
    """The body parsed as JSON (a large body in a worker process: see `offload`)."""
    body = await read_body(request)
    return await request.app.state.offload.run(len(body), parse_json, body)


async def predict(
    request: "Request",
    model: "tuple[int, Predictor, Batcher]",
    feeds: dict[str, "np.ndarray"],
    timeout_s: float | None = None,
) -> tuple[int, dict[str, "np.ndarray"]]:
    """`(version, outputs)` of `model` (`repository.batcher`'s answer) through its batcher,
    within the request timeout. The size limit counts every output the model computes,
    whichever the answer holds (they are all in memory at once)."""
    state = request.app.state
    chosen, predictor, batcher = model
    arrays = predictor.check(feeds)
    check_response_size(state.settings, predictor.output_specs, arrays)
    try:
        future = batcher.submit(arrays)
    except RuntimeError:  # its batcher stopped: the version was unloaded, or a drain began
        raise ServingError(
            503, "the model version was unloaded or the server is shutting down; retry"
        ) from None
    timeout = request_timeout(state.settings, timeout_s)
    try:
        async with asyncio.timeout(timeout):
            outputs = await asyncio.wrap_future(future)
    except TimeoutError:
        raise ServingError(504, f"request timed out after {timeout:g} s") from None
    return chosen, outputs


def request_timeout(settings: "ServerSettings", timeout_s: float | None = None) -> float:
    """The server's timeout, or the client's when that is shorter."""
    return min(settings.request_timeout_s, timeout_s or settings.request_timeout_s)


def check_response_size(
    settings: "ServerSettings",
    output_specs: Sequence[Mapping[str, Any]],
    arrays: Mapping[str, "np.ndarray"],
) -> None:
    """Refuses, before any compute, a request whose rows or outputs pass the limits: a
    small request must not buy a huge answer (issue 19: 768 KB in, 210 MB of JSON out)."""
    rows = max((a.shape[0] for a in arrays.values() if a.ndim), default=0)
    if rows > settings.max_rows_per_request:
        raise ServingError(
            413, f"request has {rows} rows; at most {settings.max_rows_per_request} per "
                 "request (--max-rows-per-request)",
        )  # fmt: skip
    length = max((a.shape[1] for a in arrays.values() if a.ndim > 1), default=1)
    size = 0
    for spec in output_specs:
        axes = {"batch": rows, "sequence": length}
        size += 4 * math.prod(axes.get(d, d if isinstance(d, int) else 1) for d in spec["shape"])
    if size > settings.max_output_bytes:
        raise ServingError(
            413, f"the outputs would hold {size} bytes (float32), over the "
                 f"{settings.max_output_bytes}-byte limit (--max-output-bytes): send fewer "
                 "rows or shorter sequences",
        )  # fmt: skip
