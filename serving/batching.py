"""Adaptive request batching for one model: never waits when the queue is short.

`workers` threads each take the oldest queued request and merge into it requests already
waiting (up to `max_batch_size` rows), padded along the sequence axis to the longest; results
are split back and trimmed to each request's length. By default (`schedule="length"`) the
companions are the queued requests nearest the oldest one in length, while the batch's real
positions stay at least `min_fill` of those computed: mixed traffic pays little padding, and as
every batch takes the oldest request, none waits behind more batches than there are requests
ahead of it. `schedule="arrival"` merges the requests right behind it in arrival order instead
(what TF Serving's batcher computes with `pad_variable_length_inputs`; Triton's dynamic
batcher merges only requests of equal shapes). With an empty
queue a request runs at once, alone, so light load pays no delay; `max_delay_ms` is only
spent collecting more rows when others are already waiting (load is present). Several
workers keep onnxruntime busy while results are split and the next batch is assembled.
Under load, `CapTuner` lowers (or raises back) the row cap to the size that measured the
fewest seconds per row (per real position, where lengths vary), so merging never settles on
batches slower than smaller ones.
"""

import collections
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Iterable

import numpy as np
from keras_attn_serving.tuning import CapTuner

log = logging.getLogger("keras_attn.serve")


class _Request:
    __slots__ = ("alone", "feeds", "future", "key", "length", "rows")

    def __init__(self, feeds: dict[str, np.ndarray], sequence_axis_inputs: frozenset[str]) -> None:
        self.feeds = feeds
        self.future: concurrent.futures.Future[dict[str, np.ndarray]] = concurrent.futures.Future()
        first = next(iter(feeds.values()))
        self.rows = first.shape[0] if first.ndim else 1
        lengths = {feeds[n].shape[1] for n in sequence_axis_inputs if n in feeds}
        rows = {a.shape[0] if a.ndim else 1 for a in feeds.values()}
        self.length = next(iter(lengths)) if len(lengths) == 1 else None
        # Requests merge when names, dtypes and every axis but batch (and sequence) agree.
        self.key: tuple = tuple(
            (name, a.dtype, a.shape[2:] if name in sequence_axis_inputs else a.shape[1:])
            for name, a in sorted(feeds.items())
        )
        # Inputs that disagree in rows or length run alone, at once: whatever the model makes
        # of them (an error, most likely) is theirs, never their batch companions'.
        self.alone = len(lengths) > 1 or len(rows) > 1
        if self.alone:
            self.key = (id(self),)


class _Batch:
    """The requests taken for one call, and the positions it computes."""

    def __init__(self, first: _Request) -> None:
        self.first, self.key = first, first.key
        self.requests = [first]
        self.rows = first.rows
        self.longest = first.length or 0
        self.real = first.rows * self.longest

    def fill_with(self, request: _Request) -> float:
        """The share of real positions if `request` joined."""
        longest = max(self.longest, request.length or 0)
        computed = (self.rows + request.rows) * longest
        real = self.real + request.rows * (request.length or 0)
        return real / computed if computed else 1.0

    def add(self, request: _Request) -> None:
        self.requests.append(request)
        self.rows += request.rows
        self.longest = max(self.longest, request.length or 0)
        self.real += request.rows * (request.length or 0)

    @property
    def positions(self) -> int:
        return self.rows * self.longest

    @property
    def padding(self) -> int:
        return self.positions - self.real


class Batcher:
    """Runs `run(feeds) -> outputs` (dicts of arrays with a leading batch axis) for
    concurrent callers, merging what is queued.

    Args:
        run: the model call, e.g. `Predictor.run_checked`.
        max_batch_size: most rows per merged call; 1 turns merging off.
        max_delay_ms: longest a batch waits for more rows, only while others are queued.
        workers: threads calling `run` concurrently.
        sequence_inputs: inputs whose axis 1 is the sequence, padded with `pad_value`.
        sequence_outputs: outputs whose axis 1 is the sequence, trimmed back per request.
        schedule: `"length"` (companions nearest in length) or `"arrival"` (the requests
            right behind the oldest, in order).
        min_fill: with `schedule="length"`, the least share of a batch's computed positions
            (rows x longest) that are real; a companion that would lower it below waits.
        on_batch: optional callback `(rows, queue_depth, cap, positions, padding)` for
            metrics: positions computed along the sequence axis, and how many were padding.
        clock: what the cap tuner times a batch with: `time.thread_time` where `run` computes
            in the calling thread alone (a one-thread onnxruntime session): the CPU time the
            batch cost, without the time its thread waited for a core while the event loop
            and other workers had it. It removes that one source of noise; the tuner's rule
            (a smaller cap moves when no dearer) can still drift down on noise that remains.
    """

    def __init__(
        self,
        run: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]],
        max_batch_size: int = 32,
        max_delay_ms: float = 0.0,
        workers: int = 2,
        sequence_inputs: Iterable[str] = (),
        sequence_outputs: Iterable[str] = (),
        pad_value: float = 0,
        schedule: str = "length",
        min_fill: float = 0.9,
        on_batch: Callable[[int, int, int, int, int], None] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if not isinstance(max_batch_size, int) or max_batch_size < 1:
            raise ValueError(f"`max_batch_size` must be >= 1. Received: {max_batch_size!r}")
        if not max_delay_ms >= 0:
            raise ValueError(f"`max_delay_ms` must be >= 0. Received: {max_delay_ms!r}")
        if not isinstance(workers, int) or workers < 1:
            raise ValueError(f"`workers` must be >= 1. Received: {workers!r}")
        if schedule not in ("length", "arrival"):
            raise ValueError(f"`schedule` must be 'length' or 'arrival'. Received: {schedule!r}")
        if not 0 <= min_fill <= 1:
            raise ValueError(f"`min_fill` must be in [0, 1]. Received: {min_fill!r}")
        self.schedule, self.min_fill = schedule, min_fill
        self._run, self._clock = run, clock
        self.max_batch_size = max_batch_size
        self.tuner = CapTuner(max_batch_size)
        self.max_delay = max_delay_ms / 1000.0
        self.sequence_inputs = frozenset(sequence_inputs)
        self.sequence_outputs = frozenset(sequence_outputs)
        self.pad_value = pad_value
        self._on_batch = on_batch
        self._queue: collections.deque[_Request] = collections.deque()
        self._ready = threading.Condition()
        self._closed = False
        self._threads = [
            threading.Thread(target=self._work, name=f"batcher-{i}", daemon=True)
            for i in range(workers)
        ]
        for thread in self._threads:
            thread.start()

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    def submit(
        self, feeds: dict[str, np.ndarray]
    ) -> concurrent.futures.Future[dict[str, np.ndarray]]:
        """Queues one request; its future resolves to the outputs for its rows only."""
        request = _Request(feeds, self.sequence_inputs)
        with self._ready:
            if self._closed:
                raise RuntimeError("the batcher is closed")
            self._queue.append(request)
            self._ready.notify()
        return request.future

    def close(self, wait: bool = True) -> None:
        """Stops taking requests; queued ones still run (a drain)."""
        with self._ready:
            self._closed = True
            self._ready.notify_all()
        if wait:
            for thread in self._threads:
                thread.join()

    def _pop_live(self):
        """The first queued request whose caller still waits, marked running (so a late
        `cancel()` fails and its result is delivered); cancelled ones are dropped."""
        while self._queue:
            request = self._queue.popleft()
            if request.future.set_running_or_notify_cancel():
                return request
        return None

    def _take(self):
        with self._ready:
            first = None
            while first is None:
                first = self._pop_live()
                if first is None:
                    if self._closed:
                        return None
                    self._ready.wait()
            batch = _Batch(first)
            cap = self.tuner.cap
            deadline = time.monotonic() + self.max_delay if self._queue else None
            join = self._join_nearest if self.schedule == "length" else self._join_next
            while batch.rows < cap and not first.alone:  # none can join a lone one: no wait
                if join(batch, cap) or batch.rows >= cap:
                    continue  # a full batch runs now, not at the deadline
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is None or remaining <= 0 or self._closed:
                    break
                self._ready.wait(remaining)
            depth = len(self._queue)
        if self._on_batch is not None:
            try:  # a failing metrics callback must not kill the worker holding this batch
                self._on_batch(batch.rows, depth, cap, batch.positions, batch.padding)
            except Exception:
                log.exception("the batch callback failed")
        # Under load: it merged company, or left others waiting. A lone request on an empty
        # queue says nothing about which cap serves load best.
        work = batch.real if self.sequence_inputs else None
        return batch.requests, batch.rows, work, len(batch.requests) > 1 or depth > 0

    def _join_next(self, batch: "_Batch", cap: int) -> bool:
        """Arrival order: the request right behind joins if it fits. True if the queue's head
        changed (it joined, or was found cancelled); False if nothing can join now."""
        while self._queue and self._queue[0].future.cancelled():
            self._queue.popleft()
        if not self._queue:
            return False
        head = self._queue[0]
        if head.key != batch.key or batch.rows + head.rows > cap:
            return False
        self._queue.popleft()
        if head.future.set_running_or_notify_cancel():  # else cancelled just now
            batch.add(head)
        return True

    def _join_nearest(self, batch: "_Batch", cap: int) -> bool:
        """Length order: every queued request of the batch's kind that fits, nearest in
        length first, while the batch stays `min_fill` real, in one pass. Requests found
        cancelled leave the queue. Always False: a second pass would find nothing more until
        new requests arrive, which `_take` waits for (the length of `max_delay_ms`)."""
        queued = list(self._queue)
        live = [r for r in queued if not r.future.cancelled()]
        near = sorted(
            (abs((r.length or 0) - (batch.first.length or 0)), k)
            for k, r in enumerate(live)
            if r.key == batch.key
        )  # fmt: skip
        taken = set()
        for _, k in near:
            request = live[k]
            if batch.rows + request.rows <= cap and batch.fill_with(request) >= self.min_fill:
                taken.add(k)
                if request.future.set_running_or_notify_cancel():  # else cancelled just now
                    batch.add(request)
                if batch.rows >= cap:
                    break
        if taken or len(live) < len(queued):
            self._queue.clear()
            self._queue.extend(r for k, r in enumerate(live) if k not in taken)
        return False

    def _work(self):
        while (taken := self._take()) is not None:
            batch, rows, work, loaded = taken
            start = self._clock()
            try:
                self._execute(batch)
                if loaded:
                    self.tuner.record(rows, self._clock() - start, work)
            except Exception as error:  # every waiting caller gets the error
                for request in batch:
                    if not request.future.done():
                        request.future.set_exception(error)

    def _execute(self, batch):
        if len(batch) == 1:
            batch[0].future.set_result(self._run(batch[0].feeds))
            return
        longest = max((r.length or 0) for r in batch)
        merged = {}
        for name in batch[0].feeds:
            parts = [r.feeds[name] for r in batch]
            if name in self.sequence_inputs:
                parts = [self._pad(p, longest) for p in parts]
            merged[name] = np.concatenate(parts, axis=0)
        outputs = self._run(merged)
        start = 0
        for request in batch:
            stop = start + request.rows
            result = {}
            for name, value in outputs.items():
                part = value[start:stop]
                if name in self.sequence_outputs and request.length is not None:
                    part = part[:, : request.length]
                result[name] = part
            request.future.set_result(result)
            start = stop

    def _pad(self, array, length):
        missing = length - array.shape[1]
        if missing <= 0:
            return array
        widths = [(0, 0), (0, missing)] + [(0, 0)] * (array.ndim - 2)
        return np.pad(array, widths, constant_values=self.pad_value)
