"""Text endpoints (`keras_attn_serving.text`): raw text in, tokenized here; `classify`, `tag`,
`embed`, and greedy `generate` / `generate_stream` (Triton's generate extension)."""

import json
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from keras_attn_serving.flow import Flow
from keras_attn_serving.generation_request import GenerationRequest, generation_request
from keras_attn_serving.handling import json_body, log, predict, request_timeout
from keras_attn_serving.offload import JSON_BYTES_PER_VALUE, dumps
from keras_attn_serving.protocol import ServingError, shown
from keras_attn_serving.text import TEXT_PARAMETERS, TextModel
from keras_attn_serving.tokenizer import TokenizerError

router = APIRouter()


async def text_task(
    request: Request, name: str, version: str | None, task: str
) -> tuple[int, TextModel, dict[str, Any], dict[str, Any]]:
    """`(version, TextModel, payload, parameters)` of a text request, checked for the task."""
    state = request.app.state
    chosen, predictor, batcher = await state.repository.load(name, version)
    model = TextModel(predictor, batcher)
    model.require(task)
    payload = await json_body(request)
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
        raise ServingError(
            400, f"`parameters` must be an object; received {shown(parameters)}"[:300]
        )
    unknown = sorted(set(parameters or {}) - TEXT_PARAMETERS[task])
    if unknown:  # never silently ignored (temperature on a greedy decoder, a typo)
        supported = ", ".join(sorted(TEXT_PARAMETERS[task])) or "none"
        raise ServingError(
            400, f"parameters {unknown} are not supported by /{task} (supported: "
                 f"{supported})"[:400],
        )  # fmt: skip
    return chosen, model, payload, parameters or {}


def capped_texts(request: Request, payload: Any) -> list[str]:
    """The request's texts, at most `max_rows_per_request` of them (else 413), each cut to
    `max_text_chars` characters before it is tokenized."""
    settings = request.app.state.settings
    texts = TextModel.texts(payload)
    if len(texts) > settings.max_rows_per_request:
        raise ServingError(
            413, f"request has {len(texts)} texts; at most {settings.max_rows_per_request} per "
                 "request (--max-rows-per-request)",
        )  # fmt: skip
    return [text[: settings.max_text_chars] for text in texts]


async def json_answer(
    request: Request, answer: dict[str, Any], outputs: dict[str, "np.ndarray"]
) -> Response:
    """`answer` as JSON, encoded in a worker process when it is large (FastAPI would encode
    it on the event loop, in Python); sized by the model `outputs` it was made from."""
    size = sum(np.size(o) for o in outputs.values()) * JSON_BYTES_PER_VALUE
    content = await request.app.state.offload.run(size, dumps, answer)
    return Response(content, media_type="application/json")


async def tokenized(request: Request, function: Any, *args: Any) -> Any:
    """`function(*args)`, which tokenizes, off the event loop and under the server's time
    limit for it (`Tokenizing`): a tokenizer's cost can grow with the text without bound."""
    try:
        return await request.app.state.tokenizing.run(function, *args)
    except TokenizerError as error:
        raise ServingError(400, str(error)) from None


async def text_outputs(
    request: Request, name: str, version: str | None, task: str
) -> tuple[dict[str, str], TextModel, dict[str, "np.ndarray"], list[list[int]], dict[str, Any]]:
    chosen, model, payload, parameters = await text_task(request, name, version, task)
    texts = capped_texts(request, payload)
    feeds, packed = await tokenized(request, model.encode, texts)
    assert model.batcher is not None  # text_task built it with the server's batcher
    _, outputs = await predict(request, (chosen, model.predictor, model.batcher), feeds)
    header = {"model_name": name, "model_version": str(chosen)}
    return header, model, outputs, packed, parameters


@router.post("/v2/models/{name}/classify")
@router.post("/v2/models/{name}/versions/{version}/classify")
async def classify(name: str, request: Request, version: str | None = None):
    header, model, outputs, _, _ = await text_outputs(request, name, version, "classify")
    return await json_answer(request, {**header, "predictions": model.classify(outputs)}, outputs)


@router.post("/v2/models/{name}/tag")
@router.post("/v2/models/{name}/versions/{version}/tag")
async def tag(name: str, request: Request, version: str | None = None):
    header, model, outputs, packed, _ = await text_outputs(request, name, version, "tag")
    answer = {**header, "predictions": model.tag(outputs, packed)}
    return await json_answer(request, answer, outputs)


@router.post("/v2/models/{name}/embed")
@router.post("/v2/models/{name}/versions/{version}/embed")
async def embed(name: str, request: Request, version: str | None = None):
    header, model, outputs, packed, parameters = await text_outputs(request, name, version, "embed")
    normalize = parameters.get("normalize", model.embedding["normalize"])
    if not isinstance(normalize, bool):
        raise ServingError(
            400, f"`normalize` must be true or false; received {shown(normalize)}"[:200]
        )
    pooling = parameters.get("pooling", model.embedding["pooling"])
    vectors = model.embed(outputs, packed, pooling, normalize)
    return await json_answer(request, {**header, "embeddings": vectors}, outputs)


async def generation(
    request: Request, name: str, version: str | None
) -> tuple[dict[str, str], TextModel, list[int], GenerationRequest]:
    """`(header, TextModel, prompt ids, checked parameters)` of a generation request."""
    chosen, model, payload, parameters = await text_task(request, name, version, "generate")
    text = payload.get("text_input")
    if not isinstance(text, str):
        raise ServingError(400, f"`text_input` must be one string; received {shown(text)}"[:200])
    (text,) = TextModel.texts(payload)  # valid Unicode
    limit = request.app.state.settings.max_text_chars
    if len(text) > limit:
        raise ServingError(
            413, f"the prompt has {len(text)} characters; at most {limit} (--max-text-chars)"
        )
    checked = generation_request(
        parameters, model.words.vocabulary_size, model.predictor.end_token_ids
    )
    header = {"model_name": name, "model_version": str(chosen)}
    prompt = await tokenized(request, model.prompt, text)
    return header, model, prompt, checked


def flow(request: Request, model: TextModel, prompt: list[int], checked: GenerationRequest
         ) -> Flow:  # fmt: skip
    """The generation of a request, under the server's time limit (the one place it is set)."""
    return Flow(model, prompt, checked, request_timeout(request.app.state.settings))


async def first_pair(pairs: AsyncGenerator[tuple[int, str], None]) -> tuple[int, str] | None:
    """The first pair of a generation, awaited before answering: a request the decode loop
    refuses gets a 400 and a timeout a 504, not a cut stream."""
    try:
        return await anext(pairs, None)
    except TimeoutError as error:
        await pairs.aclose()
        raise ServingError(504, str(error)) from None
    except ValueError as error:  # e.g. prompt + max_tokens longer than the model allows
        await pairs.aclose()
        raise ServingError(400, str(error)[:300]) from None


@router.post("/v2/models/{name}/generate")
@router.post("/v2/models/{name}/versions/{version}/generate")
async def generate(name: str, request: Request, version: str | None = None):
    header, model, prompt, checked = await generation(request, name, version)
    pairs = flow(request, model, prompt, checked).pairs()
    first = await first_pair(pairs)
    collected = [] if first is None else [first]
    try:
        collected += [pair async for pair in pairs]
    except TimeoutError as error:
        raise ServingError(504, str(error)) from None
    return {**header, "text_output": "".join(delta for _, delta in collected),
            "token_ids": [token for token, _ in collected]}  # fmt: skip


@router.post("/v2/models/{name}/generate_stream")
@router.post("/v2/models/{name}/versions/{version}/generate_stream")
async def generate_stream(name: str, request: Request, version: str | None = None):
    header, model, prompt, checked = await generation(request, name, version)
    pairs = flow(request, model, prompt, checked).pairs()
    first = await first_pair(pairs)

    async def events() -> AsyncIterator[str]:  # Server-Sent Events, one per token (Triton's)
        if first is None:
            return
        try:
            yield _event(header, *first)
            async for token, delta in pairs:
                yield _event(header, token, delta)
        except TimeoutError as error:  # the answer has begun: the last event says why it ends
            yield _error_event(header, str(error))
        except Exception:  # e.g. the model was reloaded: the last event says the stream ends
            log.exception("generation failed after its answer began")
            yield _error_event(header, "generation failed; the model may have been reloaded")
        finally:
            await pairs.aclose()

    return ClosingStream(events(), media_type="text/event-stream")


def _event(header: dict[str, Any], token: int, delta: str) -> str:
    return f"data: {json.dumps({**header, 'text_output': delta, 'token_id': token})}\n\n"


def _error_event(header: dict[str, Any], message: str) -> str:
    """A stream's last event once its answer has begun: why it ends."""
    return f"data: {json.dumps({**header, 'error': message})}\n\n"


class ClosingStream(StreamingResponse):
    """A `StreamingResponse` that closes its body when the response ends in any way: a client
    that leaves mid-stream frees its decode row at once, not when the generator is collected."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()  # type: ignore[attr-defined]
