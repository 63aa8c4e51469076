"""One async generation flow for every route (native `/generate`, `/generate_stream` and the
OpenAI routes): prompt ids and checked parameters in, `(id, text delta)` pairs out, under the
server's time limit, applied here only.

The pairs come from shared decode steps (`DecodeBatcher.astream`: no thread waits) or, for a
model that decodes each prompt alone (an artifact without a per-row decode graph, or
`--decode-rows 0`), from its decode loop in a worker thread, one hop per id. `Flow` also
says how the generation ended (`finish_reason`: `"stop"` at a stop id or string, `"length"`
at `max_tokens`) and how many ids it made.
"""

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from keras_attn_serving.generation_request import GenerationRequest
    from keras_attn_serving.text import TextModel

_DONE = object()


class Flow:
    """One generation. Iterate `pairs()` once; then `finish_reason` and `tokens` hold.

    Args:
        model: the served `TextModel`.
        prompt: the prompt's ids (checked against the model's vocabulary and length).
        request: the checked parameters.
        timeout: seconds the generation may take, the server's `request_timeout`.
    """

    def __init__(self, model: "TextModel", prompt: list[int], request: "GenerationRequest",
                 timeout: float) -> None:  # fmt: skip
        self.model, self.prompt, self.request, self.timeout = model, prompt, request, timeout
        self.tokens = 0
        self.ids: list[int] = []  # the ids sent, in order
        self.finish_reason: str | None = None
        self.outcome: dict[str, Any] = {}
        self.offsets: Any = None  # a completion's text offsets (`openai_scores.Offsets`)

    async def pairs(self) -> AsyncGenerator[tuple[int, str], None]:
        """The `(id, delta)` pairs as ids are chosen; `TimeoutError` past the time limit,
        `ValueError` for a request the decode loop refuses."""
        deadline = time.perf_counter() + self.timeout
        shared = self.model.astream(self.prompt, self.request, deadline, self.outcome)
        source: AsyncGenerator[tuple[int, str], None] = (
            shared if shared is not None
            else _threaded(self.model.stream(self.prompt, self.request, self.outcome), deadline)
        )  # fmt: skip
        try:
            async for pair in source:
                self.tokens += 1
                self.ids.append(pair[0])
                yield pair
        except TimeoutError:
            raise TimeoutError(f"generation timed out after {self.timeout:g} s") from None
        finally:
            await source.aclose()
        stopped = self.outcome.get("stop_string") or self.tokens < self.request.max_tokens
        self.finish_reason = "stop" if stopped else "length"


async def _threaded(tokens: Iterator[tuple[int, str]], deadline: float
                    ) -> AsyncGenerator[tuple[int, str], None]:  # fmt: skip
    """A decode loop that runs alone, driven from a worker thread id by id: the event loop
    never blocks on it, and it stops computing at `deadline`. On the way out (its end, a
    timeout, a client gone) the step in flight is let finish before the loop is closed."""
    step: asyncio.Future[Any] | None = None
    try:
        while True:
            if time.perf_counter() > deadline:
                raise TimeoutError
            step = asyncio.ensure_future(asyncio.to_thread(next, tokens, _DONE))
            pair = await asyncio.shield(step)  # a cancel leaves the thread's step running
            step = None
            if pair is _DONE:
                return
            yield pair
    finally:
        if step is not None:
            await asyncio.wait([step])
        with contextlib.suppress(Exception):
            await asyncio.to_thread(tokens.close)  # type: ignore[attr-defined]
