"""HTTP inference server over exported artifact folders: KServe v2 (Open Inference Protocol)
JSON and TF Serving REST, on onnxruntime. Never imports tensorflow or keras.

    keras-attn-serve --model-repository DIR --port 8000

`DIR/NAME/VERSION/` are artifact folders written by `keras_attn_export.export_model` (Triton's
repository layout; VERSION is a positive integer). Each file's sha256 is checked against
its `manifest.json` before the model loads; the newest version answers when none is named.
"""

import argparse
import itertools
import json
import logging
import math
import os
import re
import threading
import time
from pathlib import Path

import numpy as np
from keras_attn_serving.batching import Batcher
from keras_attn_serving.manifest import ArtifactError
from keras_attn_serving.predictor import InputError, Predictor
from keras_attn_serving.protocol import (
    NUMPY_TO_V2,
    ServingError,
    decode_request,
    encode_response,
    requested_outputs,
)
from keras_attn_serving.settings import ModelConfig, ServerSettings
from keras_attn_serving.text import TEXT_PARAMETERS, TextModel

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def _cores():
    """CPUs this process may run on (a container's share, not the host's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


class ModelRepository:
    """The models under `root`, loaded on first use and kept; names and versions are checked
    before they touch the file system, so no request reaches outside `root`.

    Each loaded model gets a `Batcher`; `DIR/NAME/config.json` (a `ModelConfig`) overrides
    the batching arguments for that model.
    """

    def __init__(
        self, root, verify=True, num_threads=None, max_batch_size=32, max_delay_ms=0.0,
        workers=2, on_batch=None,
    ):  # fmt: skip
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise ValueError(f"`model_repository` must be a folder. Received: {root}")
        self.verify = verify
        # Each of the `workers` threads runs its own batch: together they fill the cores, so
        # onnxruntime's thread pools do not contend for them (2 workers x 2 threads on 2 cores
        # ran 0.56 of raw onnxruntime under load, 2 x 1 thread 0.96: bench/serve_load.py).
        self.num_threads = num_threads or max(1, _cores() // workers)
        self.batching = {"max_batch_size": max_batch_size, "max_delay_ms": max_delay_ms,
                         "workers": workers}  # fmt: skip
        self.on_batch = on_batch  # `model name -> callback(rows, queue depth, cap)`
        self._loaded = {}
        self._lock = threading.Lock()

    def names(self):
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and NAME.match(p.name))

    def servable(self):
        """Whether any model has a numbered version folder (what readiness needs)."""
        return any(
            p.name.isdigit() and p.is_dir()
            for name in self.names()
            for p in (self.root / name).iterdir()
        )

    def versions(self, name):
        if not isinstance(name, str) or not NAME.match(name) or ".." in name:
            raise ServingError(400, f"invalid model name {name!r}")
        folder = self.root / name
        if not folder.is_dir():
            raise ServingError(404, f"unknown model {name!r}")
        versions = sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit() and p.is_dir())
        if not versions:
            raise ServingError(404, f"model {name!r} has no numbered version folders")
        return versions

    def resolve(self, name, version=None):
        """`(version, folder)`: the named version, or the newest."""
        versions = self.versions(name)
        if version is None or version == "":
            chosen = versions[-1]
        else:
            if not str(version).isdigit():
                raise ServingError(400, f"invalid model version {version!r}")
            chosen = int(version)
            if chosen not in versions:
                raise ServingError(404, f"model {name!r} has no version {chosen}")
        return chosen, self.root / name / str(chosen)

    def get(self, name, version=None):
        """`(version, predictor)`."""
        chosen, loaded = self._load(name, version)
        return chosen, loaded[0]

    def batcher(self, name, version=None):
        """`(version, predictor, batcher)`."""
        chosen, loaded = self._load(name, version)
        return chosen, loaded[0], loaded[1]

    def _load(self, name, version):
        chosen, folder = self.resolve(name, version)
        key = (name, chosen)
        with self._lock:
            if key not in self._loaded:
                try:
                    predictor = Predictor(folder, self.verify, self.num_threads)
                    config = self._config(name)
                except ArtifactError as error:
                    raise ServingError(500, f"model {name!r} version {chosen}: {error}") from None
                self._loaded[key] = (predictor, self._make_batcher(name, predictor, config))
        return chosen, self._loaded[key]

    def _config(self, name):
        path = self.root / name / "config.json"
        if not path.is_file():
            return ModelConfig()
        try:
            return ModelConfig.model_validate_json(path.read_text())
        except ValueError as error:
            raise ArtifactError(f"config.json: {error}") from None

    def _make_batcher(self, name, predictor, config):
        sequence_inputs = [s["name"] for s in predictor.inputs.values() if _sequence_axis(s)]
        sequence_outputs = [s["name"] for s in predictor.output_specs if _sequence_axis(s)]
        pads = config.pad_sequences and sequence_inputs and _padding_is_safe(
            predictor, sequence_inputs, sequence_outputs
        )  # fmt: skip
        options = dict(self.batching)
        for field in ("max_batch_size", "max_delay_ms"):
            if getattr(config, field) is not None:
                options[field] = getattr(config, field)
        return Batcher(
            predictor.run_checked, **options,
            sequence_inputs=sequence_inputs if pads else (),
            sequence_outputs=sequence_outputs if pads else (),
            on_batch=self.on_batch(name) if self.on_batch else None,
        )  # fmt: skip

    def loaded(self):
        """`[(name, version, predictor, batcher)]` of the models loaded so far."""
        with self._lock:
            return [(n, v, p, b) for (n, v), (p, b) in self._loaded.items()]

    def close(self):
        """Runs what is queued, then stops every model's batcher (the end of a drain)."""
        for *_, batcher in self.loaded():
            batcher.close()


def _sequence_axis(spec):
    return len(spec["shape"]) >= 2 and spec["shape"][1] == "sequence"


def _padding_is_safe(predictor, sequence_inputs, sequence_outputs, tolerance=1e-4):
    """Whether zero-padding a request changes nothing at its real positions (the model masks
    id 0), checked once on a probe: length 5 alone vs padded to 8."""
    rng = np.random.default_rng(0)
    high = min(predictor.manifest.vocabulary_size or 50, 50)
    feeds = {}
    for spec in predictor.inputs.values():
        shape = [1, 5] + [d if isinstance(d, int) else 2 for d in spec["shape"][2:]]
        low = 1 if spec["name"] in sequence_inputs and "segment" not in spec["name"] else 0
        high_here = 2 if "segment" in spec["name"] else high
        feeds[spec["name"]] = rng.integers(low, high_here, shape).astype(spec["dtype"])
    padded = {
        k: np.pad(v, [(0, 0), (0, 3)] + [(0, 0)] * (v.ndim - 2)) if k in sequence_inputs else v
        for k, v in feeds.items()
    }
    try:
        alone, merged = predictor.run(feeds), predictor.run(padded)
    except (InputError, ValueError):
        return False
    for name, value in alone.items():
        other = merged[name][:, :5] if name in sequence_outputs else merged[name]
        if other.shape != value.shape or not np.allclose(other, value, atol=tolerance):
            return False
    return True


def _v2_tensor_spec(spec):
    datatype = NUMPY_TO_V2.get(spec["dtype"], spec["dtype"].upper())
    shape = [d if isinstance(d, int) else -1 for d in spec["shape"]]
    return {"name": spec["name"], "datatype": datatype, "shape": shape}


class Gate:
    """ASGI middleware around every route: the concurrency limit (503 + Retry-After), metrics
    and one JSON log line per request. (Plain ASGI: Starlette's `BaseHTTPMiddleware` costs
    about a millisecond per request.)"""

    UNLIMITED = ("/metrics", "/v2/health/live", "/v2/health/ready")

    def __init__(self, app, settings, metrics, log):
        self.app, self.settings, self.metrics, self.log = app, settings, metrics, log
        self.in_flight = 0

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path, started, status = scope["path"], time.perf_counter(), [500]
        limited = path not in self.UNLIMITED

        async def record_status(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        if limited and self.in_flight >= self.settings.max_concurrency:
            from starlette.responses import JSONResponse

            busy = JSONResponse(
                {"error": f"server busy: {self.settings.max_concurrency} requests in flight"},
                status_code=503, headers={"Retry-After": "1"},
            )  # fmt: skip
            await busy(scope, receive, record_status)
        else:
            self.in_flight += limited
            self.metrics.in_flight.set(self.in_flight)
            try:
                await self.app(scope, receive, record_status)
            finally:
                self.in_flight -= limited
                self.metrics.in_flight.set(self.in_flight)
        seconds = time.perf_counter() - started
        route = getattr(scope.get("route"), "path", "unmatched")
        self.metrics.observe(route, status[0], seconds)
        if self.log.isEnabledFor(logging.INFO):
            self.log.info("request", extra={"method": scope["method"], "path": path,
                                            "status": status[0],
                                            "ms": round(1000 * seconds, 3)})  # fmt: skip


def create_app(repository, settings=None, **overrides):
    """The FastAPI application serving `repository` (a `ModelRepository` or a folder).

    `settings` is a `ServerSettings` (its `model_repository` is ignored when `repository` is
    a `ModelRepository`); keyword `overrides` replace single settings, e.g.
    `create_app(folder, max_body_bytes=1024)`.
    """
    import asyncio
    import contextlib

    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response, StreamingResponse
    from keras_attn_serving.observability import Metrics

    root = repository.root if isinstance(repository, ModelRepository) else repository
    if settings is None:
        settings = ServerSettings(model_repository=root, **overrides)
    elif overrides:
        settings = settings.model_copy(update=overrides)
    metrics = Metrics()
    if not isinstance(repository, ModelRepository):
        repository = ModelRepository(
            repository, settings.verify_sha256, settings.session_threads,
            settings.max_batch_size, settings.max_delay_ms, settings.batch_workers,
        )  # fmt: skip
    if repository.on_batch is None:
        repository.on_batch = metrics.on_batch
    log = logging.getLogger("keras_attn.serve")
    max_body_bytes = settings.max_body_bytes

    @contextlib.asynccontextmanager
    async def lifespan(app):
        log.info("serving", extra={"repository": str(repository.root),
                                   "models": repository.names()})  # fmt: skip
        yield
        # uvicorn has stopped accepting and waited for in-flight requests (SIGTERM drain);
        # queued batches finish before the process exits.
        await asyncio.to_thread(repository.close)
        log.info("drained")

    docs = {} if settings.openapi else {"docs_url": None, "redoc_url": None, "openapi_url": None}
    app = FastAPI(title="keras-attn-serve", lifespan=lifespan, **docs)
    app.state.repository = repository
    app.state.settings = settings
    app.state.metrics = metrics
    app.add_middleware(Gate, settings=settings, metrics=metrics, log=log)

    async def predict(name, version, feeds, timeout_s=None):
        """`(version, outputs)` through the model's batcher, within the request timeout."""
        chosen, predictor, batcher = repository.batcher(name, version)
        arrays = predictor.check(feeds)
        check_response_size(predictor.output_specs, arrays)
        try:
            future = batcher.submit(arrays)
        except RuntimeError:
            raise ServingError(503, "server is shutting down") from None
        timeout = min(settings.request_timeout_s, timeout_s or settings.request_timeout_s)
        try:
            return chosen, await asyncio.wait_for(asyncio.wrap_future(future), timeout)
        except TimeoutError:
            raise ServingError(504, f"request timed out after {timeout:g} s") from None

    def check_response_size(output_specs, arrays):
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
            size += 4 * math.prod(
                axes.get(d, d if isinstance(d, int) else 1) for d in spec["shape"]
            )
        if size > settings.max_output_bytes:
            raise ServingError(
                413, f"the outputs would hold {size} bytes (float32), over the "
                     f"{settings.max_output_bytes}-byte limit (--max-output-bytes): send fewer "
                     "rows or shorter sequences",
            )  # fmt: skip

    @app.get("/metrics")
    def prometheus_metrics():
        for name, _, _, batcher in repository.loaded():
            metrics.queue_depth.labels(name).set(batcher.queue_depth)
        return Response(metrics.exposition(), media_type="text/plain; version=0.0.4")

    @app.exception_handler(ServingError)
    async def serving_error(request, error: ServingError):
        return JSONResponse({"error": error.message}, status_code=error.status)

    @app.exception_handler(InputError)
    async def input_error(request, error: InputError):
        return JSONResponse({"error": str(error)}, status_code=400)

    @app.exception_handler(Exception)
    async def unexpected_error(request, error: Exception):
        # The details (paths, node names, addresses) go to the log, not to the client; the
        # connection is closed after a 500, and the client is told so.
        log.exception("internal error on %s %s", request.method, request.url.path)
        return JSONResponse(
            {"error": "internal error"}, status_code=500, headers={"Connection": "close"}
        )

    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException

    @app.exception_handler(HTTPException)
    async def http_error(request, error: HTTPException):
        return JSONResponse({"error": str(error.detail)}, status_code=error.status_code)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request, error):
        return JSONResponse({"error": f"invalid request: {error.errors()}"}, status_code=400)

    async def read_body(request: Request):
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > max_body_bytes:
            raise ServingError(413, f"request body exceeds {max_body_bytes} bytes")
        # Counted while it arrives: a chunked body (no Content-Length) is refused once it
        # passes the limit, never read whole first.
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_body_bytes:
                raise ServingError(413, f"request body exceeds {max_body_bytes} bytes")
            chunks.append(chunk)
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
            raise ServingError(415, f"unsupported Content-Encoding {encoding!r}")
        if len(body) > max_body_bytes:
            raise ServingError(413, f"request body exceeds {max_body_bytes} bytes")
        return body

    async def json_body(request: Request):
        body = await read_body(request)
        try:
            import json

            return json.loads(body)
        except ValueError as error:
            raise ServingError(400, f"request body is not JSON: {error}") from None

    # --- KServe v2 / Open Inference Protocol -------------------------------------------
    @app.get("/v2")
    def server_metadata():
        from importlib.metadata import version

        return {
            "name": "keras-attn-serve",
            "version": version("keras-attn"),
            "extensions": ["binary_tensor_data"],
        }

    @app.get("/v2/health/live")
    def live():
        return {}

    @app.get("/v2/health/ready")
    def ready():
        if not repository.servable():
            raise ServingError(503, "no model in the repository has a version to serve")
        return {}

    # Each model route answers with and without `/versions/{version}` (the newest version).
    @app.get("/v2/models/{name}")
    @app.get("/v2/models/{name}/versions/{version}")
    def model_metadata(name: str, version: str | None = None):
        _, predictor = repository.get(name, version)
        return {
            "name": name,
            "versions": [str(v) for v in repository.versions(name)],
            "platform": "onnxruntime_onnx",
            "inputs": [_v2_tensor_spec(s) for s in predictor.inputs.values()],
            "outputs": [_v2_tensor_spec(s) for s in predictor.output_specs],
        }

    @app.get("/v2/models/{name}/ready")
    @app.get("/v2/models/{name}/versions/{version}/ready")
    def model_ready(name: str, version: str | None = None):
        repository.get(name, version)
        return {}

    @app.post("/v2/models/{name}/infer")
    @app.post("/v2/models/{name}/versions/{version}/infer")
    async def infer(name: str, request: Request, version: str | None = None):
        body = await read_body(request)
        header_length = request.headers.get("inference-header-content-length")
        payload, feeds = decode_request(body, header_length)
        timeout_us = (payload.get("parameters") or {}).get("timeout")  # tritonclient's, in µs
        timeout_s = timeout_us / 1e6 if isinstance(timeout_us, int | float) and timeout_us else None
        chosen, outputs = await predict(name, version, feeds, timeout_s)
        wanted = requested_outputs(payload, list(outputs))
        header = {"model_name": name, "model_version": str(chosen)}
        if "id" in payload:
            header["id"] = payload["id"]
        # Encoding a large answer takes a while: off the event loop, so health checks and
        # other requests are not held up behind it.
        content, json_length = await asyncio.to_thread(encode_response, header, outputs, wanted)
        if json_length is None:
            return Response(content, media_type="application/json")
        return Response(
            content,
            media_type="application/octet-stream",
            headers={"Inference-Header-Content-Length": str(json_length)},
        )

    # --- Text endpoints (keras_attn_serving.text): raw text in, tokenized here -------------
    async def text_task(name, version, task, request):
        """`(version, TextModel, payload)` of a text request, checked for the model's task."""
        payload = await json_body(request)
        chosen, predictor = repository.get(name, version)
        model = TextModel(predictor)
        model.require(task)
        parameters = payload.get("parameters") if isinstance(payload, dict) else None
        if parameters is not None and not isinstance(parameters, dict):
            raise ServingError(
                400, f"`parameters` must be an object; received {parameters!r}"[:300]
            )
        unknown = sorted(set(parameters or {}) - TEXT_PARAMETERS[task])
        if unknown:  # never silently ignored (temperature on a greedy decoder, a typo)
            supported = ", ".join(sorted(TEXT_PARAMETERS[task])) or "none"
            raise ServingError(
                400, f"parameters {unknown} are not supported by /{task} (supported: "
                     f"{supported}{'; decoding is greedy' if task == 'generate' else ''})"[:400],
            )  # fmt: skip
        return chosen, model, payload, parameters or {}

    async def text_outputs(name, version, task, request):
        chosen, model, payload, parameters = await text_task(name, version, task, request)
        feeds, packed = model.encode(TextModel.texts(payload))
        _, outputs = await predict(name, version, feeds)
        header = {"model_name": name, "model_version": str(chosen)}
        return header, model, outputs, packed, parameters

    @app.post("/v2/models/{name}/classify")
    @app.post("/v2/models/{name}/versions/{version}/classify")
    async def classify(name: str, request: Request, version: str | None = None):
        header, model, outputs, _, _ = await text_outputs(name, version, "classify", request)
        return {**header, "predictions": model.classify(outputs)}

    @app.post("/v2/models/{name}/tag")
    @app.post("/v2/models/{name}/versions/{version}/tag")
    async def tag(name: str, request: Request, version: str | None = None):
        header, model, outputs, packed, _ = await text_outputs(name, version, "tag", request)
        return {**header, "predictions": model.tag(outputs, packed)}

    @app.post("/v2/models/{name}/embed")
    @app.post("/v2/models/{name}/versions/{version}/embed")
    async def embed(name: str, request: Request, version: str | None = None):
        header, model, outputs, packed, parameters = await text_outputs(
            name, version, "embed", request
        )
        normalize = parameters.get("normalize", False)
        if not isinstance(normalize, bool):
            raise ServingError(400, f"`normalize` must be true or false; received {normalize!r}")
        vectors = model.embed(outputs, packed, parameters.get("pooling", "mean"), normalize)
        return {**header, "embeddings": vectors}

    async def generation(name, version, request):
        """`(header, TextModel, prompt ids, max_tokens, stop ids)` of a checked request."""
        chosen, model, payload, parameters = await text_task(name, version, "generate", request)
        text = payload.get("text_input")
        if not isinstance(text, str):
            raise ServingError(400, f"`text_input` must be one string; received {text!r}"[:200])
        max_tokens = parameters.get("max_tokens", 20)
        stop = parameters.get("stop_token_ids", [])
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise ServingError(400, f"`max_tokens` must be an integer >= 1; received "
                                    f"{max_tokens!r}")  # fmt: skip
        size = model.tokenizer.vocabulary_size
        if not isinstance(stop, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t < size for t in stop
        ):
            raise ServingError(400, f"`stop_token_ids` must be a list of ids in [0, {size}); "
                                    f"received {stop!r}"[:300])  # fmt: skip
        header = {"model_name": name, "model_version": str(chosen)}
        return header, model, model.prompt(text), max_tokens, stop

    @app.post("/v2/models/{name}/generate")
    @app.post("/v2/models/{name}/versions/{version}/generate")
    async def generate(name: str, request: Request, version: str | None = None):
        header, model, prompt, max_tokens, stop = await generation(name, version, request)
        try:
            (new,) = await asyncio.to_thread(
                model.predictor.generate_ids, [prompt], max_tokens, stop
            )
        except ValueError as error:  # e.g. prompt + max_tokens longer than the model allows
            raise ServingError(400, str(error)) from None
        return {**header, "text_output": model.continuation(prompt, new), "token_ids": new}

    @app.post("/v2/models/{name}/generate_stream")
    @app.post("/v2/models/{name}/versions/{version}/generate_stream")
    async def generate_stream(name: str, request: Request, version: str | None = None):
        header, model, prompt, max_tokens, stop = await generation(name, version, request)
        tokens = model.stream(prompt, max_tokens, stop)
        try:  # the first token before answering: a bad request gets a 400, not a cut stream
            first = await asyncio.to_thread(next, tokens, None)
        except ValueError as error:
            raise ServingError(400, str(error)) from None

        def events():  # Server-Sent Events, one per token (Triton's generate_stream)
            for token, delta in [] if first is None else itertools.chain([first], tokens):
                event = {**header, "text_output": delta, "token_id": token}
                yield f"data: {json.dumps(event)}\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    # --- TF Serving REST -----------------------------------------------------------------
    @app.get("/v1/models/{name}")
    @app.get("/v1/models/{name}/versions/{version}")
    def tfs_status(name: str, version: str | None = None):
        chosen, _ = repository.get(name, version)
        return {
            "model_version_status": [
                {"version": str(chosen), "state": "AVAILABLE",
                 "status": {"error_code": "OK", "error_message": ""}}
            ]
        }  # fmt: skip

    @app.get("/v1/models/{name}/metadata")
    @app.get("/v1/models/{name}/versions/{version}/metadata")
    def tfs_metadata(name: str, version: str | None = None):
        chosen, predictor = repository.get(name, version)

        def tensor_info(spec):
            dims = [{"size": str(d if isinstance(d, int) else -1)} for d in spec["shape"]]
            return {"dtype": "DT_" + spec["dtype"].upper(), "tensor_shape": {"dim": dims},
                    "name": spec["name"]}  # fmt: skip

        signature = {
            "inputs": {s["name"]: tensor_info(s) for s in predictor.inputs.values()},
            "outputs": {s["name"]: tensor_info(s) for s in predictor.output_specs},
            "method_name": "tensorflow/serving/predict",
        }
        return {
            "model_spec": {"name": name, "signature_name": "", "version": str(chosen)},
            "metadata": {"signature_def": {"signature_def": {"serving_default": signature}}},
        }

    @app.post("/v1/models/{name}:predict")
    @app.post("/v1/models/{name}/versions/{version}:predict")
    async def tfs_predict(name: str, request: Request, version: str | None = None):
        body = await json_body(request)
        _, predictor = repository.get(name, version)
        names = [s["name"] for s in predictor.inputs.values()]
        if not isinstance(body, dict) or ("instances" in body) == ("inputs" in body):
            raise ServingError(400, "request must have exactly one of `instances` or `inputs`")
        if "instances" in body:  # row format: a list of instances
            rows = body["instances"]
            if not isinstance(rows, list) or not rows:
                raise ServingError(400, "`instances` must be a non-empty list")
            if all(isinstance(r, dict) for r in rows):
                feeds = {k: [r.get(k) for r in rows] for k in rows[0]}
            elif len(names) == 1:
                feeds = {names[0]: rows}
            else:
                raise ServingError(400, f"each instance must be an object with {names}")
        else:  # columnar format
            columns = body["inputs"]
            feeds = columns if isinstance(columns, dict) else {names[0]: columns}
        arrays = {}
        for key, value in feeds.items():
            try:
                arrays[key] = np.asarray(value)
            except ValueError as error:
                raise ServingError(400, f"input {key!r} is not rectangular: {error}") from None
        _, outputs = await predict(name, version, arrays)
        content = await asyncio.to_thread(_tfs_answer, outputs, "instances" in body)
        return Response(content, media_type="application/json")

    return app


def _tfs_answer(outputs, rows):
    """TF Serving's JSON answer: `predictions` per row, or `outputs` by column (encoded here,
    in a worker thread, not on the event loop)."""
    if rows:
        if len(outputs) == 1:
            (values,) = outputs.values()
            answer = {"predictions": values.tolist()}
        else:
            count = len(next(iter(outputs.values())))
            answer = {"predictions": [{k: v[i].tolist() for k, v in outputs.items()}
                                      for i in range(count)]}  # fmt: skip
    elif len(outputs) == 1:
        answer = {"outputs": next(iter(outputs.values())).tolist()}
    else:
        answer = {"outputs": {k: v.tolist() for k, v in outputs.items()}}
    return json.dumps(answer).encode()


def parse_settings(argv=None) -> ServerSettings:
    """`ServerSettings` from flags (one per field, e.g. `--max-batch-size`), then
    `KERAS_ATTN_*` environment variables, then the defaults."""
    import pydantic

    parser = argparse.ArgumentParser(
        prog="keras-attn-serve", description="Serve exported models over HTTP (onnxruntime)."
    )
    for name, field in ServerSettings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        help_text = f"{field.description or ''} (env KERAS_ATTN_{name.upper()})".strip()
        if field.annotation is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None,
                                help=help_text)  # fmt: skip
        else:
            parser.add_argument(flag, default=None, metavar=name.upper(), help=help_text)
    args = {k: v for k, v in vars(parser.parse_args(argv)).items() if v is not None}
    try:
        return ServerSettings(**args)
    except pydantic.ValidationError as error:
        parser.error(str(error))


def main(argv=None):
    import uvicorn
    from keras_attn_serving.observability import configure_logging

    settings = parse_settings(argv)
    configure_logging(settings.log_level)
    app = create_app(settings.model_repository, settings)
    uvicorn.run(
        app, host=settings.host, port=settings.port, log_config=None, access_log=False,
        timeout_graceful_shutdown=settings.drain_timeout_s,
    )  # fmt: skip


if __name__ == "__main__":
    main()
