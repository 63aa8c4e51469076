"""OpenAI-compatible routes: `/v1/models`, `/v1/chat/completions`, `/v1/completions` and
`/v1/embeddings`, as the official `openai` client and the applications built on it
(LangChain's `ChatOpenAI`, LlamaIndex) speak them.

Thin translations onto what the native routes run: the request's fields are checked and
mapped to the native parameters (`generation_request`), a conversation goes through the
artifact's chat template (`keras_attn_serving.chat_template`), and every choice is one
`Flow` of the shared generation path. Errors keep the native status codes in OpenAI's shape
(`handling.error_response`). The model a client names is the repository's model name.
"""

import base64
import functools
import json
import time
import uuid
from typing import TYPE_CHECKING, Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response
from keras_attn_serving.flow import Flow
from keras_attn_serving.generation_request import MAX_NAMES, generation_request
from keras_attn_serving.handling import json_body, predict, request_timeout
from keras_attn_serving.openai_scores import (
    Offsets,
    _chat_logprobs,
    _chat_scores,
    _chosen,
    _completion_logprobs,
    _completion_scores,
    _grammars,
)
from keras_attn_serving.openai_streams import _cached, _collect, _started, _stream_response, _usage
from keras_attn_serving.protocol import ServingError, shown
from keras_attn_serving.routes_text import json_answer, tokenized
from keras_attn_serving.text import TextModel

if TYPE_CHECKING:
    from keras_attn_serving.generation_request import GenerationRequest

router = APIRouter()

MAX_CHOICES = 8  # `n` at most: each choice is a decode row
COMPLETION_MAX_TOKENS = 16  # OpenAI's default `max_tokens` for /v1/completions
SAMPLING = {"temperature", "top_p", "top_k", "seed"}
# Fields read; `user` and zero penalties are accepted and change nothing.
CHAT_FIELDS = {"model", "messages", "max_tokens", "max_completion_tokens", "stop", "n", "stream",
               "logprobs", "top_logprobs",
               "stream_options", "user", "frequency_penalty", "presence_penalty",
               "response_format", *SAMPLING}  # fmt: skip
COMPLETION_FIELDS = {"model", "prompt", "max_tokens", "stop", "n", "stream", "stream_options",
                     "logprobs",
                     "echo", "user", "frequency_penalty", "presence_penalty",
                     *SAMPLING}  # fmt: skip
EMBEDDING_FIELDS = {"model", "input", "encoding_format", "user", "dimensions"}


async def _body(request: Request, fields: set[str]) -> dict[str, Any]:
    payload = await json_body(request)
    if not isinstance(payload, dict):
        raise ServingError(400, f"the body must be a JSON object; received "
                                f"{type(payload).__name__}")  # fmt: skip
    # Fields clients send as defaults (`"logprobs": false`, `"tools": []`) change nothing.
    inert: tuple[Any, ...] = (None, False, [], {}, "none")  # `0` is not `false` here
    payload = {k: v for k, v in payload.items()
               if k in fields or not any(type(v) is type(x) and v == x for x in inert)}  # fmt: skip
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
    """The native `/generate` parameters of an OpenAI request. As OpenAI does, a request
    samples at temperature 1 unless it says otherwise (0: greedy)."""
    parameters = {k: payload[k] for k in SAMPLING if payload.get(k) is not None}
    parameters.setdefault("temperature", 1.0)
    if payload.get(max_name) is not None:
        parameters[max_name] = payload[max_name]
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


def _checked(model: TextModel, parameters: dict[str, Any], n: int,
             default_max: int | None = None) -> list["GenerationRequest"]:  # fmt: skip
    """The checked parameters of `n` choices, before any tokenizing; with a seed, choice
    `i` draws with seed + i (reproducible, and different from its siblings)."""
    seed = parameters.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)
                             or not 0 <= seed < 2**63):  # fmt: skip
        raise ServingError(400, f"`seed` must be an integer in [0, 2**63); received "
                                f"{shown(seed)}"[:200], param="seed")  # fmt: skip
    if not set(MAX_NAMES) & set(parameters) and default_max is not None:
        parameters = {**parameters, "max_tokens": max(1, default_max)}
    checked = []
    for i in range(n):
        own = dict(parameters)
        if seed is not None:
            own["seed"] = (seed + i) % 2**63
        checked.append(generation_request(own, model.words.vocabulary_size,
                                          model.predictor.end_token_ids))  # fmt: skip
    return checked


def _run(request: Request, model: TextModel, prompt: list[int],
         checked: list["GenerationRequest"]) -> list[Flow]:  # fmt: skip
    timeout = request_timeout(request.app.state.settings)
    return [Flow(model, prompt, one, timeout) for one in checked]


def _flag(payload: dict[str, Any], name: str) -> bool:
    """A true-or-false field; absent or null is false."""
    value = payload.get(name)
    if value is not None and not isinstance(value, bool):
        raise ServingError(400, f"`{name}` must be true or false; received "
                                f"{shown(value)}"[:200], param=name)  # fmt: skip
    return bool(value)


def _stream_flag(payload: dict[str, Any]) -> tuple[bool, bool]:
    stream = _flag(payload, "stream")
    options = payload.get("stream_options")
    options = {} if options is None else options
    if not isinstance(options, dict) or not set(options) <= {"include_usage"}:
        raise ServingError(400, "`stream_options` takes `include_usage` only",
                           param="stream_options")  # fmt: skip
    if options and not stream:
        raise ServingError(400, "`stream_options` needs `stream: true`", param="stream_options")
    return stream, _flag(options, "include_usage")


@router.post("/v1/chat/completions")
async def chat_completions(request: Request):
    payload = await _body(request, CHAT_FIELDS)
    _, model = await _model(request, payload, "generate")
    chat = model.predictor.chat_template
    if chat is None:
        raise ServingError(400, "this model has no chat template: use /v1/completions",
                           param="messages")  # fmt: skip
    response_format = payload.get("response_format") or {"type": "text"}
    if not isinstance(response_format, dict):
        raise ServingError(400, "`response_format` must be an object with a `type`",
                           param="response_format")  # fmt: skip
    given = [k for k in ("max_completion_tokens", "max_tokens") if payload.get(k) is not None]
    max_name = given[0] if len(given) == 1 else "max_tokens"
    n, (stream, include_usage) = _choices(payload), _stream_flag(payload)
    parameters = {**_parameters(payload, max_name), **{k: payload[k] for k in given}}
    _checked(model, parameters, n)  # every parameter checked before the work of tokenizing
    messages = payload.get("messages")
    limit = request.app.state.settings.max_text_chars
    chars = _characters(messages)
    if chars > limit:
        raise ServingError(413, f"the messages have {chars} characters; at most {limit} "
                                "(--max-text-chars)", param="messages")  # fmt: skip
    top = _chat_logprobs(payload)
    grammars = None
    if response_format.get("type") != "text":
        grammars = await tokenized(request, _grammars, model, response_format, n)
    prompt = await tokenized(request, model.chat_prompt, chat, messages)
    # No `max_tokens`: the reply may fill the positions left, as OpenAI's may fill the context
    # (an encoder-decoder's target, after its start id).
    used = 1 if model.predictor.encoder_decoder is not None else len(prompt)
    room = (model.predictor.decode_limit or used + 256) - used
    checked = _chosen(model, _checked(model, parameters, n, room), top, grammars)
    for one in checked:
        one.reply = True
    flows = _run(request, model, prompt, checked)
    scores = functools.partial(_chat_scores, model)
    header = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()),
              "model": payload["model"]}  # fmt: skip
    if stream:
        started = await _started(flows)
        return _stream_response("chat", {**header, "object": "chat.completion.chunk"},
                                flows, started, len(prompt), include_usage,
                                logprobs_of=lambda _, f, a, b: scores(f, a, b),
                                choices_per_prompt=n)  # fmt: skip
    texts = await _collect(flows)
    choices = [{"index": i, "message": {"role": "assistant", "content": text},
                "logprobs": scores(flow, 0, flow.tokens), "finish_reason": flow.finish_reason}
               for i, (flow, text) in enumerate(zip(flows, texts, strict=True))]  # fmt: skip
    return {
        **header,
        "object": "chat.completion",
        "choices": choices,
        "usage": _usage(len(prompt), sum(f.tokens for f in flows), _cached(flows, n)),
    }


def _characters(value: Any, depth: int = 0) -> int:
    """The characters of every string in a JSON value (messages: contents, names, parts)."""
    if isinstance(value, str):
        return len(value)
    if depth > 64:
        return 0  # the conversation check refuses such nesting by name
    if isinstance(value, dict):
        return sum(_characters(v, depth + 1) for v in value.values())
    if isinstance(value, list):
        return sum(_characters(v, depth + 1) for v in value)
    return 0


def _prompts(value: Any, field: str = "prompt", most: int | None = None
             ) -> list[str | list[int]]:  # fmt: skip
    """A completions `prompt` (or an embeddings `input`): a string, a list of strings, ids,
    or a list of id lists. Id lists past `most` ids are refused before their ids are read."""
    ints = lambda v: isinstance(v, list) and v and all(  # noqa: E731
        isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 2**31 for i in v
    )  # fmt: skip
    if isinstance(value, list) and value and isinstance(value[0], int):
        rows = [value]
    else:
        rows = [v for v in value if isinstance(v, list)] if isinstance(value, list) else []
    longest = max(map(len, rows), default=0)
    if most is not None and longest > most:
        raise ServingError(400, f"`{field}` has {longest} tokens; the model takes at most "
                                f"{most}", param=field)  # fmt: skip
    if isinstance(value, str):
        return [value]
    if ints(value):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, str) or ints(v) for v in value):
        return value
    raise ServingError(400, f"`{field}` must be a string, a list of strings, a list of token "
                            "ids (integers >= 0) or a list of such lists; received "
                            f"{shown(value)}"[:300], param=field)  # fmt: skip


def _unicode(text: str, field: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:  # a lone surrogate such as "\ud800"
        raise ServingError(400, f"`{field}` is not valid Unicode text: {error.reason} at "
                                f"position {error.start}", param=field) from None  # fmt: skip


@router.post("/v1/completions")
async def completions(request: Request):
    payload = await _body(request, COMPLETION_FIELDS)
    _, model = await _model(request, payload, "generate")
    prompts = _prompts(payload.get("prompt"), most=model.prompt_limit)
    n, (stream, include_usage) = _choices(payload), _stream_flag(payload)
    if len(prompts) * n > MAX_CHOICES:
        raise ServingError(400, f"{len(prompts)} prompts x n={n} choices; at most "
                                f"{MAX_CHOICES} in one request", param="prompt")  # fmt: skip
    echo = _flag(payload, "echo")
    parameters = _parameters(payload, "max_tokens")
    top = _completion_logprobs(payload)
    _checked(model, parameters, n, COMPLETION_MAX_TOKENS)  # checked before tokenizing
    limit = request.app.state.settings.max_text_chars
    ids = []
    for one in prompts:
        if isinstance(one, str):
            if len(one) > limit:
                raise ServingError(413, f"the prompt has {len(one)} characters; at most {limit} "
                                        "(--max-text-chars)", param="prompt")  # fmt: skip
            _unicode(one, "prompt")
            ids.append(await tokenized(request, model.prompt, one, "prompt"))
        else:
            ids.append(model.id_prompt(one))
    flows = []
    for prompt in ids:  # each choice its own parameters (a sampler, its scores)
        checked = _checked(model, parameters, n, COMPLETION_MAX_TOKENS)
        flows += _run(request, model, prompt, _chosen(model, checked, top, None))
    scores = functools.partial(_completion_scores, model)
    header = {"id": f"cmpl-{uuid.uuid4().hex}", "created": int(time.time()),
              "model": payload["model"]}  # fmt: skip
    echoed = [p if isinstance(p, str) else model.words.decode(p) for p in prompts] if echo else []
    if top is not None:  # each token's place in its choice's text
        for k, flow in enumerate(flows):
            flow.offsets = Offsets(model, flow.prompt, len(echoed[k // n]) if echo else 0)
    prompt_tokens = sum(len(p) for p in ids)
    if stream:
        started = await _started(flows)
        return _stream_response("text", {**header, "object": "text_completion"}, flows,
                                started, prompt_tokens, include_usage, echoed,
                                logprobs_of=lambda _, f, a, b: scores(f, a, b),
                                choices_per_prompt=n)  # fmt: skip
    texts = await _collect(flows)
    choices = [{"index": i, "text": (echoed[i // n] if echo else "") + text,
                "logprobs": scores(flow, 0, flow.tokens), "finish_reason": flow.finish_reason}
               for i, (flow, text) in enumerate(zip(flows, texts, strict=True))]  # fmt: skip
    return {
        **header,
        "object": "text_completion",
        "choices": choices,
        "usage": _usage(prompt_tokens, sum(f.tokens for f in flows), _cached(flows, n)),
    }


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
    most = model.predictor.max_sequence_length
    entries = _prompts(inputs, "input", most) if inputs != [] else []
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
        for text in texts:
            _unicode(text, "input")
        feeds, packed = await tokenized(request, model.encode, texts)
    else:  # ids as a tokenizer gave them: packed (start and end ids) as a text's are
        rows = [model.packed_ids(e, "input") for e in entries if not isinstance(e, str)]
        feeds, packed = model.pack(rows)
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
