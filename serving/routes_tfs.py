"""TF Serving REST: model status, metadata and `:predict` (row and columnar formats)."""

import json

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response
from keras_attn_serving.handling import predict, read_body
from keras_attn_serving.offload import JSON_BYTES_PER_VALUE
from keras_attn_serving.protocol import ServingError, parse_json

router = APIRouter()


@router.get("/v1/models/{name}")
@router.get("/v1/models/{name}/versions/{version}")
def tfs_status(request: Request, name: str, version: str | None = None):
    chosen, _ = request.app.state.repository.get(name, version)
    return {
        "model_version_status": [
            {"version": str(chosen), "state": "AVAILABLE",
             "status": {"error_code": "OK", "error_message": ""}}
        ]
    }  # fmt: skip


def _tensor_info(spec):
    dims = [{"size": str(d if isinstance(d, int) else -1)} for d in spec["shape"]]
    return {"dtype": "DT_" + spec["dtype"].upper(), "tensor_shape": {"dim": dims},
            "name": spec["name"]}  # fmt: skip


@router.get("/v1/models/{name}/metadata")
@router.get("/v1/models/{name}/versions/{version}/metadata")
def tfs_metadata(request: Request, name: str, version: str | None = None):
    chosen, predictor = request.app.state.repository.get(name, version)
    signature = {
        "inputs": {s["name"]: _tensor_info(s) for s in predictor.inputs.values()},
        "outputs": {s["name"]: _tensor_info(s) for s in predictor.output_specs},
        "method_name": "tensorflow/serving/predict",
    }
    return {
        "model_spec": {"name": name, "signature_name": "", "version": str(chosen)},
        "metadata": {"signature_def": {"signature_def": {"serving_default": signature}}},
    }


@router.post("/v1/models/{name}:predict")
@router.post("/v1/models/{name}/versions/{version}:predict")
async def tfs_predict(name: str, request: Request, version: str | None = None):
    state = request.app.state
    model = await state.repository.load(name, version)
    body = await read_body(request)
    rows, arrays = await state.offload.run(len(body), decode_tfs, body, list(model[1].inputs))
    _, outputs = await predict(request, model, arrays)
    size = sum(a.size for a in outputs.values()) * JSON_BYTES_PER_VALUE
    content = await state.offload.run(size, encode_tfs, outputs, rows)
    return Response(content, media_type="application/json")


def decode_tfs(body: bytes, names: list[str]) -> tuple[bool, dict[str, np.ndarray]]:
    """`(row format, {input: array})` of a TF Serving `:predict` body."""
    body = parse_json(body)
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
        except (ValueError, TypeError, OverflowError, RecursionError) as error:
            raise ServingError(400, f"input {key!r} is not rectangular: {error}") from None
    return "instances" in body, arrays


def encode_tfs(outputs: dict[str, np.ndarray], rows: bool) -> bytes:
    """TF Serving's JSON answer: `predictions` per row, or `outputs` by column."""
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
