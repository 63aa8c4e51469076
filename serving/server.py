"""HTTP inference server over exported artifact folders: KServe v2 (Open Inference Protocol)
JSON and TF Serving REST, on onnxruntime. Never imports tensorflow or keras.

    keras-attn-serve --model-repository DIR --port 8000

`DIR/NAME/VERSION/` are artifact folders written by `export.export_model` (Triton's
repository layout; VERSION is a positive integer). Each file's sha256 is checked against
its `manifest.json` before the model loads; the newest version answers when none is named.
"""

import argparse
import os
import re
import threading
from pathlib import Path

import numpy as np

from serving.manifest import ArtifactError
from serving.predictor import InputError, Predictor
from serving.protocol import (
    NUMPY_TO_V2,
    ServingError,
    decode_request,
    encode_response,
    requested_outputs,
)

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class ModelRepository:
    """The models under `root`, loaded on first use and kept; names and versions are checked
    before they touch the file system, so no request reaches outside `root`."""

    def __init__(self, root, verify=True, num_threads=None):
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise ValueError(f"`model_repository` must be a folder. Received: {root}")
        self.verify = verify
        self.num_threads = num_threads
        self._loaded = {}
        self._lock = threading.Lock()

    def names(self):
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and NAME.match(p.name))

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
        chosen, folder = self.resolve(name, version)
        key = (name, chosen)
        with self._lock:
            if key not in self._loaded:
                try:
                    self._loaded[key] = Predictor(folder, self.verify, self.num_threads)
                except ArtifactError as error:
                    raise ServingError(500, f"model {name!r} version {chosen}: {error}") from None
        return chosen, self._loaded[key]


def _v2_tensor_spec(spec):
    datatype = NUMPY_TO_V2.get(spec["dtype"], spec["dtype"].upper())
    shape = [d if isinstance(d, int) else -1 for d in spec["shape"]]
    return {"name": spec["name"], "datatype": datatype, "shape": shape}


def create_app(repository, max_body_bytes=16 << 20):
    """The FastAPI application serving `repository` (a `ModelRepository` or a folder)."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response

    if not isinstance(repository, ModelRepository):
        repository = ModelRepository(repository)
    app = FastAPI(title="keras-attn-serve")
    app.state.repository = repository

    @app.exception_handler(ServingError)
    async def serving_error(request, error: ServingError):
        return JSONResponse({"error": error.message}, status_code=error.status)

    @app.exception_handler(InputError)
    async def input_error(request, error: InputError):
        return JSONResponse({"error": str(error)}, status_code=400)

    @app.exception_handler(Exception)
    async def unexpected_error(request, error: Exception):
        return JSONResponse({"error": f"internal error: {error}"}, status_code=500)

    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException

    @app.exception_handler(HTTPException)
    async def http_error(request, error: HTTPException):
        return JSONResponse({"error": str(error.detail)}, status_code=error.status_code)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request, error):
        return JSONResponse({"error": f"invalid request: {error.errors()}"}, status_code=400)

    async def read_body(request: Request):
        body = await request.body()
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
            "inputs": [_v2_tensor_spec(s) for s in predictor.manifest["inputs"]],
            "outputs": [_v2_tensor_spec(s) for s in predictor.manifest["outputs"]],
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
        chosen, predictor = repository.get(name, version)
        payload, feeds = decode_request(body, header_length)
        outputs = predictor.run(feeds)
        wanted = requested_outputs(payload, list(outputs))
        header = {"model_name": name, "model_version": str(chosen)}
        if "id" in payload:
            header["id"] = payload["id"]
        content, json_length = encode_response(header, outputs, wanted)
        if json_length is None:
            return Response(content, media_type="application/json")
        return Response(
            content,
            media_type="application/octet-stream",
            headers={"Inference-Header-Content-Length": str(json_length)},
        )

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
            "inputs": {s["name"]: tensor_info(s) for s in predictor.manifest["inputs"]},
            "outputs": {s["name"]: tensor_info(s) for s in predictor.manifest["outputs"]},
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
        names = [s["name"] for s in predictor.manifest["inputs"]]
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
        outputs = predictor.run(arrays)
        if "instances" in body:
            if len(outputs) == 1:
                (values,) = outputs.values()
                return {"predictions": values.tolist()}
            count = len(next(iter(outputs.values())))
            return {"predictions": [{k: v[i].tolist() for k, v in outputs.items()}
                                    for i in range(count)]}  # fmt: skip
        if len(outputs) == 1:
            return {"outputs": next(iter(outputs.values())).tolist()}
        return {"outputs": {k: v.tolist() for k, v in outputs.items()}}

    return app


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="keras-attn-serve", description="Serve exported models over HTTP (onnxruntime)."
    )
    env = os.environ.get
    parser.add_argument("--model-repository", default=env("KERAS_ATTN_MODEL_REPOSITORY"),
                        help="folder of NAME/VERSION/ artifact folders "
                        "(env KERAS_ATTN_MODEL_REPOSITORY)")  # fmt: skip
    parser.add_argument("--host", default=env("KERAS_ATTN_HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(env("KERAS_ATTN_PORT", "8000")))
    parser.add_argument("--max-body-bytes", type=int,
                        default=int(env("KERAS_ATTN_MAX_BODY_BYTES", str(16 << 20))))  # fmt: skip
    args = parser.parse_args(argv)
    if not args.model_repository:
        parser.error("--model-repository (or KERAS_ATTN_MODEL_REPOSITORY) is required")
    return args


def main(argv=None):
    import uvicorn

    args = parse_args(argv)
    app = create_app(ModelRepository(args.model_repository), args.max_body_bytes)
    uvicorn.run(app, host=args.host, port=args.port, log_level="info")


if __name__ == "__main__":
    main()
