"""The OpenAI routes' answers from their flows: every choice run to its end, or merged into
one stream of Server-Sent Events in OpenAI's chunk shape (`data: [DONE]` last), with usage;
every flow's decode row freed however the answer ends."""

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TYPE_CHECKING, Any

from keras_attn_serving.flow import Flow
from keras_attn_serving.handling import log
from keras_attn_serving.protocol import ServingError
from keras_attn_serving.routes_text import ClosingStream, first_pair

if TYPE_CHECKING:
    pass


async def _collect(flows: list[Flow]) -> list[str]:
    """Every flow run to its end, concurrently; their texts. When one fails, the others are
    cancelled (their decode rows freed) and the failure is the answer."""

    async def one(flow: Flow) -> str:
        async with contextlib.aclosing(flow.pairs()) as pairs:
            first = await first_pair(pairs)
            if first is None:
                return ""
            try:
                return first[1] + "".join([delta async for _, delta in pairs])
            except TimeoutError as error:
                raise ServingError(504, str(error)) from None

    tasks = [asyncio.ensure_future(one(f)) for f in flows]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _sse(data: Any) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


async def _merged(started: list[Any]) -> AsyncGenerator[tuple[int, int, str | None], None]:
    """`(choice, id, delta)` of every started flow as they come, `(choice, -1, None)` once a
    flow ends; a flow's failure is raised here, and every pump is cancelled on the way out."""
    queue: asyncio.Queue[Any] = asyncio.Queue()

    async def pump(index: int, pairs: Any, first: Any) -> None:
        try:
            if first is not None:
                await queue.put((index, *first))
                async for token, delta in pairs:
                    await queue.put((index, token, delta))
            await queue.put((index, -1, None))
        except Exception as error:
            await queue.put(error)

    tasks = [asyncio.ensure_future(pump(i, pairs, first))
             for i, (pairs, first) in enumerate(started)]  # fmt: skip
    try:
        ended = 0
        while ended < len(tasks):
            item = await queue.get()
            if isinstance(item, Exception):
                raise item
            ended += item[2] is None
            yield item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _close(started: list[Any]) -> None:
    for pairs, _ in started:
        await pairs.aclose()


async def _started(flows: list[Flow]) -> list[tuple[Any, Any]]:
    """Each flow's pairs and first pair, awaited before answering (errors are 4xx)."""
    started: list[tuple[Any, Any]] = []
    try:
        for flow in flows:
            pairs = flow.pairs()
            started.append((pairs, None))
            started[-1] = (pairs, await first_pair(pairs))
    except BaseException:
        await _close(started)
        raise
    return started


def _usage(prompt_tokens: int, completion: int, cached: int = 0) -> dict[str, Any]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}  # fmt: skip


def _cached(flows: list[Flow], n: int) -> int:
    """Prompt positions the prefix cache served: each prompt's first choice's."""
    return sum(int(f.outcome.get("cached_tokens", 0)) for f in flows[::n])


def _error_event(message: str, kind: str) -> str:
    return _sse({"error": {"message": message, "type": kind, "param": None, "code": None}})


def _stream_response(kind: str, header: dict[str, Any], flows: list[Flow],
                     started: list[Any], prompt_tokens: int, include_usage: bool,
                     prefix: list[str] | None = None,
                     logprobs_of: Any = None, choices_per_prompt: int = 1,
                     ) -> ClosingStream:  # fmt: skip
    """Server-Sent Events in OpenAI's chunk shape, ending with `data: [DONE]`."""

    def chunk(index: int, text: str | None, finish: str | None, first: bool = False,
              scores: Any = None) -> str:  # fmt: skip
        if kind == "chat":
            delta: dict[str, Any] = {} if text is None else {"content": text}
            if first:
                delta = {"role": "assistant", "content": ""}
            choice = {"index": index, "delta": delta, "logprobs": scores, "finish_reason": finish}
        else:
            choice = {"index": index, "text": text or "", "logprobs": scores,
                      "finish_reason": finish}  # fmt: skip
        return _sse({**header, "choices": [choice]})

    counts = [0] * len(flows)

    async def events() -> AsyncIterator[str]:
        try:
            for i in range(len(flows)):
                if kind == "chat":
                    yield chunk(i, None, None, first=True)
                elif prefix:
                    yield chunk(i, prefix[i // (len(flows) // len(prefix))], None)
            async with contextlib.aclosing(_merged(started)) as merged:
                async for index, _, delta in merged:
                    flow = flows[index]
                    if delta is None:
                        yield chunk(index, None, flow.finish_reason)
                        continue
                    scores = logprobs_of(kind, flow, counts[index], counts[index] + 1)
                    counts[index] += 1
                    if delta or scores is not None:
                        yield chunk(index, delta, None, scores=scores)
            if include_usage:
                usage = _usage(
                    prompt_tokens, sum(f.tokens for f in flows), _cached(flows, choices_per_prompt)
                )
                yield _sse({**header, "choices": [], "usage": usage})
        except TimeoutError as error:  # begun: the last event says why it ends
            yield _error_event(str(error), "timeout")
        except Exception:  # e.g. the model was reloaded: the last event says the stream ends
            log.exception("generation failed after its answer began")
            yield _error_event("generation failed; the model may have been reloaded",
                               "server_error")  # fmt: skip
        finally:
            await _close(started)
        yield "data: [DONE]\n\n"

    return ClosingStream(events(), media_type="text/event-stream")
