"""The loop of iteration-level batching (continuous batching), whatever the model: requests
wait in a queue, join the rows in flight at the next step, each choose their next id from
their own row of the step's logits, and leave when they end. `batched_generation.DecodeBatcher`
(a decoder's `decode_gqa.onnx`) and `seq2seq_batching.Seq2SeqBatcher` (an encoder-decoder's
`encode.onnx` + `decode.onnx`) say how newcomers are admitted, how one step runs, and how a
row moves; this class holds the rest: the streams a caller reads, deadlines, cancellation,
and failures kept to the requests at fault.

Rows are kept packed (requests in rows `0 … n-1`; a request that ends is replaced by the last
one). Every request draws with its own sampler on its own row, one call per step, as
`generation.decode_tokens` does for one prompt, so its ids are those of decoding it alone
(and of Keras `generate` with the same seed), whatever else shares the steps.

`stream` hands each id to the caller's thread through a queue; `astream` hands it straight to
an asyncio event loop (`call_soon_threadsafe`), so a server streams without a thread per
request waiting on the queue.
"""

import asyncio
import queue
import sys
import threading
import time
from collections import deque
from collections.abc import AsyncGenerator, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
from keras_attn_serving.decode_requests import (
    _END,
    Chooser,
    _fail,
    _flush,
    _LoopSink,
    _raised,
    _Request,
    _Sink,
)

PREFILL_ROWS = 8  # newcomers admitted in one run at most


class SharedSteps:
    """The shared decode loop's thread and its requests (a base class: see the module).

    Subclasses set `max_length` (positions a request may fill: its prompt, or the decoder
    start id, plus its new ids), `banned_id` (the id never chosen; None: none is) and
    `vocabulary_size` (the logits' width, or None), implement `_admit`, `_run_step` and
    `_move_row`, and call `_start()` once they are ready to run.

    Args:
        max_decode_rows: requests decoded together at most; more wait for a row.
    """

    max_length: int
    banned_id: int | None
    vocabulary_size: int | None
    # A request's prompt begins its target (a decoder's); False: it is a source, and the
    # target begins with the decoder start id alone (an encoder-decoder's).
    prompt_is_target = True
    prefill_rows = PREFILL_ROWS  # newcomers admitted in one run at most

    def __init__(self, max_decode_rows: int) -> None:
        rows = max_decode_rows
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
            raise ValueError(f"`max_decode_rows` must be a positive integer. Received: {rows!r}")
        self.max_decode_rows = max_decode_rows
        self.active: list[_Request] = []
        self.waiting: deque[_Request] = deque()
        self.lock = threading.Condition()
        self.closed = False
        self.steps = 0  # batched decode steps run (for tests and metrics)
        self.rows_stepped = 0  # requests advanced by them
        self.peak_rows = 0  # the most requests one step has advanced
        self.pending: list[tuple[_LoopSink, Any]] = []  # for `astream`s, put by the loop
        self.thread = threading.Thread(target=self._loop, name="decode-batcher", daemon=True)

    def _start(self) -> None:
        self.thread.start()

    def stream(self, prompt: Sequence[int], max_new_tokens: int,
               stop_token_ids: Iterable[int] = (), sampler: Chooser | None = None,
               outcome: dict[str, Any] | None = None) -> Iterator[int]:  # fmt: skip
        """The new ids of `prompt`, each as soon as its step has run; a stop token ends the
        stream and is not returned. Closing the generator early frees its row."""
        out: queue.SimpleQueue[Any] = queue.SimpleQueue()
        request = self._submit(prompt, max_new_tokens, stop_token_ids, sampler, out, outcome)
        if request is None:
            return
        try:
            while (item := out.get()) is not _END:
                yield _raised(item)
        finally:
            request.cancelled = True

    async def astream(self, prompt: Sequence[int], max_new_tokens: int,
                      stop_token_ids: Iterable[int] = (), sampler: Chooser | None = None,
                      deadline: float | None = None, outcome: dict[str, Any] | None = None,
                      ) -> AsyncGenerator[int, None]:  # fmt: skip
        """`stream` for a caller on an asyncio event loop: awaiting an id blocks no thread.
        Closing the generator early (or cancelling the task awaiting it) frees its row.
        Past `deadline` (a `time.perf_counter()` time) the stream raises `TimeoutError` and
        frees its row: one timer for the whole stream, not one per id."""
        late = TimeoutError("the generation passed its deadline")
        if deadline is not None and deadline <= time.perf_counter():
            raise late
        loop = asyncio.get_running_loop()
        sink = _LoopSink(loop, self.pending)
        request = self._submit(prompt, max_new_tokens, stop_token_ids, sampler, sink, outcome)
        if request is None:
            return
        timer = None
        if deadline is not None:

            def expire() -> None:  # the loop stops computing it, even for a slow reader
                request.cancelled = True
                sink.queue.put_nowait(late)

            timer = loop.call_later(deadline - time.perf_counter(), expire)
        try:
            while (item := await sink.queue.get()) is not _END:
                yield _raised(item)
        finally:
            request.cancelled = True
            if timer is not None:
                timer.cancel()

    def _submit(self, prompt: Sequence[int], max_new_tokens: int, stop_token_ids: Iterable[int],
                sampler: Chooser | None, out: _Sink, outcome: dict[str, Any] | None = None,
                ) -> "_Request | None":  # fmt: skip
        """The request, checked and queued for the loop; None when it asks for no ids."""
        prompt = [int(t) for t in prompt]
        if not prompt:
            raise ValueError("`prompt` must be a non-empty list of ids.")
        self._check_ids(prompt)
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or (
            max_new_tokens < 0
        ):  # fmt: skip
            raise ValueError(f"`max_new_tokens` must be >= 0. Received: {max_new_tokens!r}")
        # An encoder-decoder's target starts with its start id alone.
        filled = f"prompt length {len(prompt)}" if self.prompt_is_target else "the start id"
        if (len(prompt) if self.prompt_is_target else 1) + max_new_tokens > self.max_length:
            raise ValueError(
                f"{filled} + max_new_tokens {max_new_tokens} exceeds the model's maximum "
                f"sequence length {self.max_length}"
            )
        if max_new_tokens == 0:
            return None
        stop_ids = frozenset(map(int, stop_token_ids))
        request = _Request(prompt, max_new_tokens, stop_ids, sampler, out)
        request.outcome = outcome
        with self.lock:
            if self.closed:
                raise RuntimeError("the decode batcher is closed")
            self.waiting.append(request)
            self.lock.notify()
        return request

    def close(self) -> None:
        """Ends the loop; requests in flight get an error."""
        with self.lock:
            self.closed = True
            self.lock.notify()
        self.thread.join(timeout=10)

    # The loop (one thread): admit waiting requests, then one step for every active row.

    def _loop(self) -> None:
        while True:
            with self.lock:
                while not self.closed and not self.waiting and not self.active:
                    self.lock.wait()
                if self.closed:
                    break
                newcomers: list[_Request] = []
                while self.waiting and len(self.active) + len(newcomers) < self.max_decode_rows:
                    newcomers.append(self.waiting.popleft())
            # By length: each admitting run pads its prompts to the longest of them.
            live = sorted((r for r in newcomers if not r.cancelled), key=lambda r: len(r.prompt))
            try:
                for request in newcomers:
                    if request.cancelled:
                        request.done = True
                        request.out.put(_END)
                self._admit_newcomers(live)
                _flush(self.pending)  # first ids chosen on admission, before the step
                self._drop_cancelled()
                if self.active:
                    try:
                        self._step()
                    except Exception as error:  # only the rows at fault, if any is
                        self._fail_step(error)
            except Exception as error:  # a failure of the loop itself: every request gets it
                for request in [*self.active, *(r for r in live if r not in self.active)]:
                    _fail(request, error)
                self.active.clear()
            _flush(self.pending)
        closed = RuntimeError("the decode batcher was closed")
        for request in [*self.active, *self.waiting]:
            _fail(request, closed)
        _flush(self.pending)

    def _admit_newcomers(self, live: list[_Request]) -> None:
        """Gives each of `live` (by prompt length) a row, `prefill_rows` to a run."""
        for start in range(0, len(live), self.prefill_rows):
            self._admit_each(live[start : start + self.prefill_rows])

    def _check_ids(self, prompt: list[int]) -> None:
        """Ids the model has no embedding for are refused before they join a shared run."""
        vocabulary = self.vocabulary_size
        if vocabulary is not None and not 0 <= min(prompt) <= max(prompt) < vocabulary:
            bad = sorted({t for t in prompt if not 0 <= t < vocabulary})
            raise ValueError(f"`prompt` has ids outside [0, {vocabulary}): {bad[:5]}")

    def _admit(self, requests: list[_Request]) -> None:
        """Runs what `requests` need before their first shared step, in one run, and
        appends each to `active` (the row it gets)."""
        raise NotImplementedError

    def _admit_each(self, requests: list[_Request]) -> None:
        """`_admit`, with rows isolated: when a run fails, each of its prompts is tried
        alone, and only a prompt that fails alone gets the error."""
        try:
            self._admit(requests)
            return
        except Exception as error:
            left = [r for r in requests if not r.done and not any(r is a for a in self.active)]
            if len(requests) == 1 or len(left) < len(requests):
                for request in left:  # alone, or failed past the run: these get the error
                    _fail(request, error)
                return
        for request in requests:
            self._admit_each([request])

    def _fail_step(self, error: Exception) -> None:
        """A failed step ends the rows whose inputs are at fault (an id past the vocabulary,
        a position past the cache); only when none is, every row gets the error."""
        vocabulary = self.vocabulary_size or sys.maxsize
        faulty = [
            row for row, r in enumerate(self.active)
            if not 0 <= r.next_token < vocabulary or not 0 <= r.position < self.max_length
        ]  # fmt: skip
        rows = faulty or list(range(len(self.active)))
        for row in sorted(rows, reverse=True):  # backwards: a finished row takes the last one
            self.active[row].out.put(error)
            self._finish(row)

    def _run_step(self, count: int) -> np.ndarray:
        """One decode step of the `count` active rows (each its `next_token` at its
        `position`); the logits `(rows >= count, vocab)`."""
        raise NotImplementedError

    def _step(self) -> None:
        count = len(self.active)
        logits = self._run_step(count)
        self.steps += 1
        self.rows_stepped += count
        self.peak_rows = max(self.peak_rows, count)
        greedy = self._greedy(logits[:count])
        for row in range(count - 1, -1, -1):  # backwards: a finished row takes the last one
            request = self.active[row]
            request.position += 1
            self._choose(row, request, logits[row], greedy[row])

    def _greedy(self, logits: np.ndarray) -> np.ndarray:
        """The greedy id of every row at once (one pass, not one per request): float32's
        argmax is float64's, as widening keeps every order and every tie."""
        return self._banned(logits, logits.dtype).argmax(-1)

    def _banned(self, logits: np.ndarray, dtype: Any) -> np.ndarray:
        """A copy of `logits` (`(rows, vocab)`) as `dtype`, the banned id never chosen."""
        logits = np.array(logits, dtype)
        if self.banned_id is not None:
            logits[:, self.banned_id] = -np.inf
        return logits

    def _forced(self, request: _Request, logits: np.ndarray) -> np.ndarray | None:
        """`request`'s float64 logits `(1, vocab)` where a forcing rule holds at its step
        (`sampling.force_ends`); None where none does."""
        return None

    def _choose(self, row: int, request: _Request, logits: np.ndarray, greedy: int) -> None:
        """Picks `request`'s next id (`greedy`, or its sampler's draw from its float64
        logits); sends it, or ends the request."""
        try:  # a request's own chooser (a grammar, say) fails that request alone
            forced = self._forced(request, logits)
            if request.sampler is None:
                token = int(greedy if forced is None else forced.argmax(-1)[0])
            else:
                row_logits = self._banned(logits[None], np.float64) if forced is None else forced
                token = int(request.sampler(row_logits)[0])
        except Exception as error:
            _fail(request, error)
            self._finish(row)
            return
        request.produced += 1
        stopped = token in request.stop_ids
        if not stopped:
            request.out.put(token)
        if stopped or request.produced >= request.max_new_tokens or request.cancelled:
            self._finish(row)
        else:
            request.next_token = token

    def _drop_cancelled(self) -> None:
        for row in range(len(self.active) - 1, -1, -1):
            if self.active[row].cancelled:
                self._finish(row)

    def _move_row(self, source: int, row: int, request: _Request) -> None:
        """Copies what the model holds for `request` from row `source` into `row`."""
        raise NotImplementedError

    def _finish(self, row: int) -> None:
        """Ends the request in `row`; the last active request moves into its row."""
        request = self.active[row]
        request.done = True
        request.out.put(_END)
        last = len(self.active) - 1
        if row != last:
            moved = self.active[last]
            self._move_row(last, row, moved)
            self.active[row] = moved
        self.active.pop()
