"""KServe v2 / Open Inference Protocol: server and model metadata, health, and `infer` (JSON
and the binary tensor extension)."""

from fastapi import APIRouter, Request
from fastapi.responses import Response
from keras_attn_serving.handling import direct, predict, read_body
from keras_attn_serving.offload import JSON_BYTES_PER_VALUE
from keras_attn_serving.protocol import (
    NUMPY_TO_V2,
    ServingError,
    client_timeout_s,
    decode_request,
    encode_response,
    requested_outputs,
)

router = APIRouter()


def _v2_tensor_spec(spec):
    datatype = NUMPY_TO_V2.get(spec["dtype"], spec["dtype"].upper())
    shape = [d if isinstance(d, int) else -1 for d in spec["shape"]]
    return {"name": spec["name"], "datatype": datatype, "shape": shape}


@router.get("/v2")
def server_metadata():
    from importlib.metadata import version

    return {
        "name": "keras-attn-serve",
        "version": version("keras-attn"),
        "extensions": ["binary_tensor_data"],
    }


@router.get("/v2/health/live")
def live():
    return {}


@router.get("/v2/health/ready")
def ready(request: Request):
    if not request.app.state.repository.servable():
        raise ServingError(503, "no model in the repository has a version to serve")
    return {}


# Each model route answers with and without `/versions/{version}` (the newest version).
@router.get("/v2/models/{name}")
@router.get("/v2/models/{name}/versions/{version}")
def model_metadata(request: Request, name: str, version: str | None = None):
    repository = request.app.state.repository
    _, predictor = repository.get(name, version)
    return {
        "name": name,
        "versions": [str(v) for v in repository.versions(name)],
        "platform": "onnxruntime_onnx",
        "inputs": [_v2_tensor_spec(s) for s in predictor.inputs.values()],
        "outputs": [_v2_tensor_spec(s) for s in predictor.output_specs],
    }


@router.get("/v2/models/{name}/ready")
@router.get("/v2/models/{name}/versions/{version}/ready")
def model_ready(request: Request, name: str, version: str | None = None):
    request.app.state.repository.get(name, version)
    return {}


@router.post("/v2/models/{name}/infer")
@router.post("/v2/models/{name}/versions/{version}/infer")
async def infer(request: Request, name: str, version: str | None = None):
    state = request.app.state
    # The model first: a body for an unknown model is never decoded.
    model = await state.repository.load(name, version)
    chosen, predictor, _ = model
    body = await read_body(request)
    header_length = request.headers.get("inference-header-content-length")
    payload, feeds = await state.offload.run(
        len(body), decode_request, body, header_length, predictor.inputs,
        state.settings.max_rows_per_request,
    )  # fmt: skip
    timeout_us = (payload.get("parameters") or {}).get("timeout")  # tritonclient's, in µs
    timeout_s = client_timeout_s(timeout_us)
    wanted = requested_outputs(payload, predictor.output_names)
    _, outputs = await predict(request, model, feeds, timeout_s)
    header = {"model_name": name, "model_version": str(chosen)}
    if "id" in payload:
        header["id"] = payload["id"]
    # A large answer is encoded in a worker process: json.dumps holds the GIL throughout.
    size = sum(outputs[n].size for n, binary in wanted if not binary) * JSON_BYTES_PER_VALUE
    content, json_length = await state.offload.run(size, encode_response, header, outputs, wanted)
    if json_length is None:
        return Response(content, media_type="application/json")
    return Response(
        content,
        media_type="application/octet-stream",
        headers={"Inference-Header-Content-Length": str(json_length)},
    )


# The hot route, answered by the server's `Gate` itself (the routes above stay for the
# OpenAPI document and for an app that mounts this router without the `Gate`).
DIRECT = (
    direct("POST", "/v2/models/{name}/infer", infer, query=["version"]),
    direct("POST", "/v2/models/{name}/versions/{version}/infer", infer),
)
