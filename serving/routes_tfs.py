"""TF Serving REST: model status, metadata and `:predict` (row and columnar formats)."""

import asyncio
import json

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response
from keras_attn_serving.handling import json_body, predict
from keras_attn_serving.protocol import ServingError

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
    body = await json_body(request)
    _, predictor = request.app.state.repository.get(name, version)
    names = list(predictor.inputs)
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
    _, outputs = await predict(request, name, version, arrays)
    content = await asyncio.to_thread(_tfs_answer, outputs, "instances" in body)
    return Response(content, media_type="application/json")


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
