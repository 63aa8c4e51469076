"""What travels between a request and the decode loop (`batched_generation.DecodeBatcher`):
the request's state, and the sinks that carry its ids back, to a thread's queue or to an
asyncio event loop (one wake-up per loop and step, not one per token)."""

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

# `sampler(logits (1, vocab) float64) -> ids (1,)`: a `sampling.Sampler`, or None (greedy).
Chooser = Callable[[np.ndarray], np.ndarray]
_END = object()  # a stream's last item


class _Sink(Protocol):
    def put(self, item: Any) -> None: ...


class _LoopSink:
    """Items put by the decode thread reach an `asyncio.Queue` of `loop`: they wait in
    `pending` until the thread's `_flush`, which wakes each loop once for all of them (one
    wake-up a step, not one a token)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, pending: list[Any]) -> None:
        self.loop, self.queue, self.pending = loop, asyncio.Queue[Any](), pending

    def put(self, item: Any) -> None:
        self.pending.append((self, item))


def _flush(pending: list[tuple[_LoopSink, Any]]) -> None:
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue[Any], Any]]] = {}
    for sink, item in pending:
        by_loop.setdefault(sink.loop, []).append((sink.queue, item))
    pending.clear()
    for loop, items in by_loop.items():
        try:
            loop.call_soon_threadsafe(_deliver, items)
        except RuntimeError:  # the loop has closed: nobody is listening
            pass


def _raised(item: Any) -> int:
    """A stream's id; an error the loop sent is raised in the consumer."""
    if isinstance(item, BaseException):
        raise item
    return item


def _fail(request: "_Request", error: Exception) -> None:
    if not request.done:
        request.done = True
        request.out.put(error)
        request.out.put(_END)


def _deliver(items: list[tuple[asyncio.Queue[Any], Any]]) -> None:
    for queue_, item in items:
        queue_.put_nowait(item)


class _Request:
    def __init__(self, prompt: list[int], max_new_tokens: int, stop_ids: frozenset[int],
                 sampler: Chooser | None, out: _Sink) -> None:  # fmt: skip
        self.prompt, self.max_new_tokens = prompt, max_new_tokens
        self.stop_ids, self.sampler = stop_ids, sampler
        self.out = out
        self.position = 0  # the cache length: where the next token goes
        self.next_token = 0
        self.produced = 0
        self.cancelled = False
        self.done = False  # its end (_END) was sent
        self.outcome: dict[str, Any] | None = None  # what the loop reports (cached tokens)
