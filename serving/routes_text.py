"""Text endpoints (`keras_attn_serving.text`): raw text in, tokenized here; `classify`, `tag`,
`embed`, and greedy `generate` / `generate_stream` (Triton's generate extension)."""

import asyncio
import itertools
import json
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from keras_attn_serving.handling import json_body, predict, request_timeout
from keras_attn_serving.protocol import ServingError
from keras_attn_serving.text import TEXT_PARAMETERS, TextModel

if TYPE_CHECKING:
    import numpy as np

router = APIRouter()


async def text_task(
    request: Request, name: str, version: str | None, task: str
) -> tuple[int, TextModel, dict[str, Any], dict[str, Any]]:
    """`(version, TextModel, payload, parameters)` of a text request, checked for the task."""
    payload = await json_body(request)
    chosen, predictor = request.app.state.repository.get(name, version)
    model = TextModel(predictor)
    model.require(task)
    if not isinstance(payload, dict):
        raise ServingError(
            400, f"the body must be a JSON object; received {type(payload).__name__}"
        )
    extra = sorted(set(payload) - {"text_input", "parameters", "id"})
    if extra:  # a top-level `max_tokens` was silently ignored before
        hint = " (per-request options go inside `parameters`)" if set(extra) & set(
            TEXT_PARAMETERS[task]) else ""  # fmt: skip
        raise ServingError(
            400, f"unknown fields {[str(k)[:40] for k in extra[:8]]} in the body: it takes "
                 f"`text_input` and `parameters`{hint}"[:400],
        )  # fmt: skip
    parameters = payload.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise ServingError(400, f"`parameters` must be an object; received {parameters!r}"[:300])
    unknown = sorted(set(parameters or {}) - TEXT_PARAMETERS[task])
    if unknown:  # never silently ignored (temperature on a greedy decoder, a typo)
        supported = ", ".join(sorted(TEXT_PARAMETERS[task])) or "none"
        raise ServingError(
            400, f"parameters {unknown} are not supported by /{task} (supported: "
                 f"{supported}{'; decoding is greedy' if task == 'generate' else ''})"[:400],
        )  # fmt: skip
    return chosen, model, payload, parameters or {}


async def text_outputs(
    request: Request, name: str, version: str | None, task: str
) -> tuple[dict[str, str], TextModel, dict[str, "np.ndarray"], list[list[int]], dict[str, Any]]:
    chosen, model, payload, parameters = await text_task(request, name, version, task)
    feeds, packed = model.encode(TextModel.texts(payload))
    _, outputs = await predict(request, name, version, feeds)
    header = {"model_name": name, "model_version": str(chosen)}
    return header, model, outputs, packed, parameters


@router.post("/v2/models/{name}/classify")
@router.post("/v2/models/{name}/versions/{version}/classify")
async def classify(name: str, request: Request, version: str | None = None):
    header, model, outputs, _, _ = await text_outputs(request, name, version, "classify")
    return {**header, "predictions": model.classify(outputs)}


@router.post("/v2/models/{name}/tag")
@router.post("/v2/models/{name}/versions/{version}/tag")
async def tag(name: str, request: Request, version: str | None = None):
    header, model, outputs, packed, _ = await text_outputs(request, name, version, "tag")
    return {**header, "predictions": model.tag(outputs, packed)}


@router.post("/v2/models/{name}/embed")
@router.post("/v2/models/{name}/versions/{version}/embed")
async def embed(name: str, request: Request, version: str | None = None):
    header, model, outputs, packed, parameters = await text_outputs(request, name, version, "embed")
    normalize = parameters.get("normalize", model.embedding["normalize"])
    if not isinstance(normalize, bool):
        raise ServingError(400, f"`normalize` must be true or false; received {normalize!r}"[:200])
    pooling = parameters.get("pooling", model.embedding["pooling"])
    vectors = model.embed(outputs, packed, pooling, normalize)
    return {**header, "embeddings": vectors}


async def generation(
    request: Request, name: str, version: str | None
) -> tuple[dict[str, str], TextModel, list[int], int, list[int]]:
    """`(header, TextModel, prompt ids, max_tokens, stop ids)` of a checked request."""
    chosen, model, payload, parameters = await text_task(request, name, version, "generate")
    text = payload.get("text_input")
    if not isinstance(text, str):
        raise ServingError(400, f"`text_input` must be one string; received {text!r}"[:200])
    TextModel.texts(payload)  # valid Unicode
    max_tokens = parameters.get("max_tokens", 20)
    stop = parameters.get("stop_token_ids", [])
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise ServingError(400, f"`max_tokens` must be an integer >= 1; received "
                                f"{max_tokens!r}"[:200])  # fmt: skip
    size = model.words.vocabulary_size
    if not isinstance(stop, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and 0 <= t < size for t in stop
    ):
        raise ServingError(400, f"`stop_token_ids` must be a list of ids in [0, {size}); "
                                f"received {stop!r}"[:300])  # fmt: skip
    header = {"model_name": name, "model_version": str(chosen)}
    return header, model, model.prompt(text), max_tokens, stop


def _until(deadline, timeout, tokens):
    """`tokens`, ending in `TimeoutError` once `deadline` (a `perf_counter` time) passes: a
    generation stops computing when its request times out."""
    for token in tokens:
        if time.perf_counter() > deadline:
            raise TimeoutError(f"generation timed out after {timeout:g} s")
        yield token


@router.post("/v2/models/{name}/generate")
@router.post("/v2/models/{name}/versions/{version}/generate")
async def generate(name: str, request: Request, version: str | None = None):
    header, model, prompt, max_tokens, stop = await generation(request, name, version)
    timeout = request_timeout(request.app.state.settings)
    deadline = time.perf_counter() + timeout

    def run() -> list[int]:
        tokens = model.predictor.generate_tokens([prompt], max_tokens, stop)
        return [token for _, token in _until(deadline, timeout, tokens)]

    try:
        new = await asyncio.to_thread(run)
    except TimeoutError as error:
        raise ServingError(504, str(error)) from None
    except ValueError as error:  # e.g. prompt + max_tokens longer than the model allows
        raise ServingError(400, str(error)[:300]) from None
    return {**header, "text_output": model.continuation(prompt, new), "token_ids": new}


@router.post("/v2/models/{name}/generate_stream")
@router.post("/v2/models/{name}/versions/{version}/generate_stream")
async def generate_stream(name: str, request: Request, version: str | None = None):
    header, model, prompt, max_tokens, stop = await generation(request, name, version)
    timeout = request_timeout(request.app.state.settings)
    tokens = _until(time.perf_counter() + timeout, timeout, model.stream(prompt, max_tokens, stop))
    try:  # the first token before answering: a bad request gets a 400, not a cut stream
        first = await asyncio.to_thread(next, tokens, None)
    except TimeoutError as error:
        raise ServingError(504, str(error)) from None
    except ValueError as error:
        raise ServingError(400, str(error)[:300]) from None

    def events() -> Iterator[str]:  # Server-Sent Events, one per token (Triton's generate_stream)
        try:
            for token, delta in [] if first is None else itertools.chain([first], tokens):
                event = {**header, "text_output": delta, "token_id": token}
                yield f"data: {json.dumps(event)}\n\n"
        except TimeoutError as error:  # the answer has begun: the last event says why it ends
            yield f"data: {json.dumps({**header, 'error': str(error)})}\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")
