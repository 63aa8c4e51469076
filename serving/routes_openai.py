"""OpenAI-compatible routes: `/v1/models`, `/v1/chat/completions`, `/v1/completions` and
`/v1/embeddings`, as the official `openai` client and the applications built on it
(LangChain's `ChatOpenAI`, LlamaIndex) speak them.

Thin translations onto what the native routes run: the request's fields are checked and
mapped to the native parameters (`generation_request`), a conversation goes through the
artifact's chat template (`keras_attn_serving.chat_template`), and every choice is one
`Flow` of the shared generation path. Errors keep the native status codes in OpenAI's shape
(`handling.error_response`). The model a client names is the repository's model name.
"""

import asyncio
import base64
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response
from keras_attn_serving.flow import Flow
from keras_attn_serving.generation_request import generation_request
from keras_attn_serving.handling import json_body, predict, request_timeout
from keras_attn_serving.protocol import ServingError, shown
from keras_attn_serving.routes_text import ClosingStream, first_pair, json_answer, tokenized
from keras_attn_serving.text import TextModel

router = APIRouter()

MAX_CHOICES = 8  # `n` at most: each choice is a decode row
SAMPLING = {"temperature", "top_p", "top_k", "seed"}
# Fields read; `user` and zero penalties are accepted and change nothing.
CHAT_FIELDS = {"model", "messages", "max_tokens", "max_completion_tokens", "stop", "n", "stream",
               "stream_options", "user", "frequency_penalty", "presence_penalty",
               "response_format", *SAMPLING}  # fmt: skip
COMPLETION_FIELDS = {"model", "prompt", "max_tokens", "stop", "n", "stream", "stream_options",
                     "echo", "user", "frequency_penalty", "presence_penalty",
                     *SAMPLING}  # fmt: skip
EMBEDDING_FIELDS = {"model", "input", "encoding_format", "user", "dimensions"}


async def _body(request: Request, fields: set[str]) -> dict[str, Any]:
    payload = await json_body(request)
    if not isinstance(payload, dict):
        raise ServingError(400, f"the body must be a JSON object; received "
                                f"{type(payload).__name__}")  # fmt: skip
    unknown = sorted(str(k)[:40] for k in set(payload) - fields)
    if unknown:
        message = f"unsupported fields {unknown[:8]} (supported: {', '.join(sorted(fields))})"
        raise ServingError(400, message[:400], param=unknown[0])
    for penalty in ("frequency_penalty", "presence_penalty"):
        if payload.get(penalty) not in (None, 0, 0.0):
            raise ServingError(400, f"`{penalty}` is not supported (only 0)", param=penalty)
    return payload


async def _model(request: Request, payload: dict[str, Any], task: str) -> tuple[int, TextModel]:
    """The served model a request names, loaded, with its task checked."""
    name = payload.get("model")
    repository = request.app.state.repository
    if not isinstance(name, str) or not name:
        raise ServingError(400, f"`model` must be a model name; received {shown(name)}"[:200],
                           param="model")  # fmt: skip
    served = repository.names()
    if name not in served:
        message = f"model {name[:80]!r} is not served; served models: {served[:20]}"
        raise ServingError(404, message[:400], param="model", code="model_not_found")
    chosen, predictor, batcher = await repository.load(name, None)
    model = TextModel(predictor, batcher)
    model.require(task)
    return chosen, model


@router.get("/v1/models")
async def models(request: Request):
    names = request.app.state.repository.names()
    return {"object": "list", "data": [
        {"id": name, "object": "model", "created": 0, "owned_by": "keras_attn"}
        for name in names
    ]}  # fmt: skip


def _parameters(payload: dict[str, Any], max_name: str) -> dict[str, Any]:
    """The native `/generate` parameters of an OpenAI request."""
    parameters = {k: payload[k] for k in SAMPLING if payload.get(k) is not None}
    if payload.get(max_name) is not None:
        parameters["max_tokens"] = payload[max_name]
    if payload.get("stop") is not None:
        parameters["stop"] = payload["stop"]
    return parameters


def _choices(payload: dict[str, Any]) -> int:
    n = payload.get("n", 1)
    if n is None:
        return 1
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_CHOICES:
        raise ServingError(400, f"`n` must be an integer in [1, {MAX_CHOICES}]; received "
                                f"{shown(n)}"[:200], param="n")  # fmt: skip
    return n


def _flows(request: Request, model: TextModel, prompt: list[int], parameters: dict[str, Any],
           n: int) -> list[Flow]:  # fmt: skip
    """`n` flows of one prompt; with a seed, choice `i` draws with seed + i (reproducible,
    and different from its siblings)."""
    timeout = request_timeout(request.app.state.settings)
    flows = []
    for i in range(n):
        own = dict(parameters)
        if isinstance(own.get("seed"), int) and not isinstance(own["seed"], bool):
            own["seed"] = (own["seed"] + i) % 2**63
        checked = generation_request(own, model.words.vocabulary_size,
                                     model.predictor.end_token_ids)  # fmt: skip
        flows.append(Flow(model, prompt, checked, timeout))
    return flows


def _stream_flag(payload: dict[str, Any]) -> tuple[bool, bool]:
    stream = payload.get("stream") or False
    if not isinstance(stream, bool):
        raise ServingError(400, "`stream` must be true or false", param="stream")
    options = payload.get("stream_options") or {}
    if not isinstance(options, dict) or not set(options) <= {"include_usage"}:
        raise ServingError(400, "`stream_options` takes `include_usage` only",
                           param="stream_options")  # fmt: skip
    return stream, bool(options.get("include_usage"))


async def _collect(flows: list[Flow]) -> list[str]:
    """Every flow run to its end, concurrently; their texts."""

    async def one(flow: Flow) -> str:
        pairs = flow.pairs()
        first = await first_pair(pairs)
        if first is None:
            return ""
        try:
            return first[1] + "".join([delta async for _, delta in pairs])
        except TimeoutError as error:
            raise ServingError(504, str(error)) from None

    return list(await asyncio.gather(*(one(f) for f in flows)))


def _sse(data: Any) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


async def _merged(flows: list[Flow], firsts: list[Any]) -> AsyncIterator[tuple[int, str | None]]:
    """`(choice, delta)` of every flow as they come, `(choice, None)` once a flow ends."""
    queue: asyncio.Queue[Any] = asyncio.Queue()

    async def pump(index: int, flow: Flow, pairs: Any, first: Any) -> None:
        try:
            if first is not None:
                await queue.put((index, first[1]))
                async for _, delta in pairs:
                    await queue.put((index, delta))
            await queue.put((index, None))
        except Exception as error:
            await queue.put(error)
        finally:
            await pairs.aclose()

    tasks = [asyncio.create_task(pump(i, f, p, first))
             for i, (f, (p, first)) in enumerate(zip(flows, firsts, strict=True))]  # fmt: skip
    try:
        for _ in range(sum(1 for _ in flows)):
            while True:
                item = await queue.get()
                if isinstance(item, Exception):
                    raise item
                yield item
                if item[1] is None:
                    break
    finally:
        for task in tasks:
            task.cancel()


async def _started(flows: list[Flow]) -> list[tuple[Any, Any]]:
    """Each flow's pairs and first pair, awaited before answering (errors are 4xx)."""
    started: list[tuple[Any, Any]] = []
    for flow in flows:
        pairs = flow.pairs()
        try:
            started.append((pairs, await first_pair(pairs)))
        except ServingError:
            for other, _ in started:
                await other.aclose()
            raise
    return started


def _usage(prompt_tokens: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion}  # fmt: skip


def _stream_response(kind: str, header: dict[str, Any], flows: list[Flow],
                     started: list[Any], prompt_tokens: int, include_usage: bool,
                     prefix: list[str] | None = None) -> ClosingStream:  # fmt: skip
    """Server-Sent Events in OpenAI's chunk shape, ending with `data: [DONE]`."""

    def chunk(index: int, text: str | None, finish: str | None, first: bool = False) -> str:
        if kind == "chat":
            delta: dict[str, Any] = {} if text is None else {"content": text}
            if first:
                delta = {"role": "assistant", "content": ""}
            choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": index, "text": text or "", "logprobs": None,
                      "finish_reason": finish}  # fmt: skip
        return _sse({**header, "choices": [choice]})

    async def events() -> AsyncIterator[str]:
        try:
            for i in range(len(flows)):
                if kind == "chat":
                    yield chunk(i, None, None, first=True)
                elif prefix:
                    yield chunk(i, prefix[i // (len(flows) // len(prefix))], None)
            async for index, delta in _merged(flows, started):
                if delta is None:
                    yield chunk(index, None, flows[index].finish_reason)
                elif delta:
                    yield chunk(index, delta, None)
            if include_usage:
                usage = _usage(prompt_tokens, sum(f.tokens for f in flows))
                yield _sse({**header, "choices": [], "usage": usage})
        except TimeoutError as error:  # begun: the last event says why it ends
            yield _sse({"error": {"message": str(error), "type": "timeout", "param": None,
                                  "code": None}})  # fmt: skip
        yield "data: [DONE]\n\n"

    return ClosingStream(events(), media_type="text/event-stream")


@router.post("/v1/chat/completions")
async def chat_completions(request: Request):
    payload = await _body(request, CHAT_FIELDS)
    _, model = await _model(request, payload, "generate")
    chat = model.predictor.chat_template
    if chat is None:
        raise ServingError(400, "this model has no chat template: use /v1/completions",
                           param="messages")  # fmt: skip
    response_format = payload.get("response_format") or {"type": "text"}
    if not isinstance(response_format, dict) or response_format.get("type") != "text":
        raise ServingError(400, "`response_format` other than text is not supported yet",
                           param="response_format")  # fmt: skip
    if "max_tokens" in payload and "max_completion_tokens" in payload:
        raise ServingError(400, "give `max_completion_tokens` or `max_tokens`, not both",
                           param="max_tokens")  # fmt: skip
    max_name = "max_completion_tokens" if "max_completion_tokens" in payload else "max_tokens"
    n, (stream, include_usage) = _choices(payload), _stream_flag(payload)
    parameters = _parameters(payload, max_name)
    prompt = await tokenized(request, model.chat_prompt, chat, payload.get("messages"))
    flows = _flows(request, model, prompt, parameters, n)
    header = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()),
              "model": payload["model"]}  # fmt: skip
    if stream:
        started = await _started(flows)
        return _stream_response("chat", {**header, "object": "chat.completion.chunk"},
                                flows, started, len(prompt), include_usage)  # fmt: skip
    texts = await _collect(flows)
    choices = [{"index": i, "message": {"role": "assistant", "content": text},
                "logprobs": None, "finish_reason": flow.finish_reason}
               for i, (flow, text) in enumerate(zip(flows, texts, strict=True))]  # fmt: skip
    return {**header, "object": "chat.completion", "choices": choices,
            "usage": _usage(len(prompt), sum(f.tokens for f in flows))}  # fmt: skip


def _prompts(value: Any) -> list[str | list[int]]:
    """A completions `prompt`: a string, a list of strings, ids, or a list of id lists."""
    ints = lambda v: isinstance(v, list) and v and all(  # noqa: E731
        isinstance(i, int) and not isinstance(i, bool) for i in v)  # fmt: skip
    if isinstance(value, str):
        return [value]
    if ints(value):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, str) or ints(v) for v in value):
        return value
    raise ServingError(400, "`prompt` must be a string, a list of strings, a list of token "
                            f"ids or a list of such lists; received {shown(value)}"[:300],
                       param="prompt")  # fmt: skip


@router.post("/v1/completions")
async def completions(request: Request):
    payload = await _body(request, COMPLETION_FIELDS)
    _, model = await _model(request, payload, "generate")
    prompts = _prompts(payload.get("prompt"))
    n, (stream, include_usage) = _choices(payload), _stream_flag(payload)
    if len(prompts) * n > MAX_CHOICES:
        raise ServingError(400, f"{len(prompts)} prompts x n={n} choices; at most "
                                f"{MAX_CHOICES} in one request", param="prompt")  # fmt: skip
    echo = payload.get("echo") or False
    if not isinstance(echo, bool):
        raise ServingError(400, "`echo` must be true or false", param="echo")
    limit = request.app.state.settings.max_text_chars
    ids = []
    for one in prompts:
        if isinstance(one, str):
            if len(one) > limit:
                raise ServingError(413, f"the prompt has {len(one)} characters; at most {limit} "
                                        "(--max-text-chars)")  # fmt: skip
            (one,) = TextModel.texts({"text_input": one})
            ids.append(await tokenized(request, model.prompt, one))
        else:
            ids.append(model.id_prompt(one))
    parameters = _parameters(payload, "max_tokens")
    flows = [f for prompt in ids for f in _flows(request, model, prompt, parameters, n)]
    header = {"id": f"cmpl-{uuid.uuid4().hex}", "created": int(time.time()),
              "model": payload["model"]}  # fmt: skip
    echoed = [p if isinstance(p, str) else model.words.decode(p) for p in prompts] if echo else []
    prompt_tokens = sum(len(p) for p in ids)
    if stream:
        started = await _started(flows)
        return _stream_response("text", {**header, "object": "text_completion"}, flows,
                                started, prompt_tokens, include_usage, echoed)  # fmt: skip
    texts = await _collect(flows)
    choices = [{"index": i, "text": (echoed[i // n] if echo else "") + text, "logprobs": None,
                "finish_reason": flow.finish_reason}
               for i, (flow, text) in enumerate(zip(flows, texts, strict=True))]  # fmt: skip
    return {**header, "object": "text_completion", "choices": choices,
            "usage": _usage(prompt_tokens, sum(f.tokens for f in flows))}  # fmt: skip


@router.post("/v1/embeddings")
async def embeddings(request: Request):
    payload = await _body(request, EMBEDDING_FIELDS)
    chosen, model = await _model(request, payload, "embed")
    if payload.get("dimensions") is not None:
        raise ServingError(400, "`dimensions` is not supported: the model's size is served",
                           param="dimensions")  # fmt: skip
    encoding = payload.get("encoding_format") or "float"
    if encoding not in ("float", "base64"):
        raise ServingError(400, f"`encoding_format` must be 'float' or 'base64'; received "
                                f"{shown(encoding)}"[:200], param="encoding_format")  # fmt: skip
    inputs = payload.get("input")
    settings = request.app.state.settings
    entries = _prompts(inputs) if inputs != [] else []
    if not entries:
        raise ServingError(400, "`input` must be a non-empty string or list", param="input")
    if len(entries) > settings.max_rows_per_request:
        limit = settings.max_rows_per_request
        raise ServingError(413, f"request has {len(entries)} inputs; at most {limit} "
                                "(--max-rows-per-request)", param="input")  # fmt: skip
    texts = [e[: settings.max_text_chars] for e in entries if isinstance(e, str)]
    if texts and len(texts) != len(entries):
        raise ServingError(400, "`input` mixes strings and token ids", param="input")
    if texts:
        TextModel.texts({"text_input": texts})
        feeds, packed = await tokenized(request, model.encode, texts)
    else:
        feeds, packed = model.pack([model.id_prompt(e, packed=False) for e in entries])
    assert model.batcher is not None  # `_model` built it with the server's batcher
    _, outputs = await predict(request, (chosen, model.predictor, model.batcher), feeds)
    pooling, normalize = model.embedding["pooling"], model.embedding["normalize"]
    vectors = model.embed(outputs, packed, str(pooling), bool(normalize))
    data = []
    for i, vector in enumerate(vectors):
        value: Any = vector
        if encoding == "base64":
            value = base64.b64encode(np.asarray(vector, "<f4").tobytes()).decode()
        data.append({"object": "embedding", "index": i, "embedding": value})
    tokens = sum(len(p) for p in packed)
    answer = {"object": "list", "data": data, "model": payload["model"],
              "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}  # fmt: skip
    return await json_answer(request, answer, outputs) if encoding == "float" else Response(
        json.dumps(answer), media_type="application/json")  # fmt: skip
