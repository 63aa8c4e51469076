"""Iteration-level batching of generation over `decode_gqa.onnx` (continuous batching).

One thread per model runs the decode steps. Each step takes one new token for every request in
flight, at its own position (`index` is `(batch,)`: GroupQueryAttention reads each row's own
length), so a request joins at the next step and leaves when it ends, instead of waiting for a
batch to form or finish. The requests that arrived since the last step are prefilled together,
in one run (up to `PREFILL_ROWS` at a time), and their keys and values copied into free rows
of the shared cache. Prompts of one length (a lone newcomer, say) are prefilled whole and the
run's logits give their first ids. Otherwise the run takes all of each prompt but its last id,
right-padded to the longest (a padded place is written past the prompt in the cache, and
overwritten by the request's own tokens before any step reads it), and each prompt's last id
goes through the next shared step, whose logits give the request's first new id.

Rows are kept packed (requests in rows `0 … n-1`; a request that ends is replaced by the last
one, whose cache rows are copied over), and a step runs on the smallest bucket of rows (1, 2,
4, then multiples of 4) that holds them: its cost follows the requests in flight, not the
capacity. Newcomers are prefilled shortest first, `PREFILL_ROWS` to a run, so that each run
pads its prompts to lengths close to theirs.

Every request draws with its own sampler on its own row, one call per step, as
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
from typing import TYPE_CHECKING, Any

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
from keras_attn_serving.generation import BucketedCache
from keras_attn_serving.prefix_cache import PrefixCache

if TYPE_CHECKING:
    import onnxruntime as ort

PREFILL_ROWS = 8  # prompts prefilled in one run at most (its cache buffer has as many rows)


class DecodeBatcher:
    """Continuous batching over one `decode_gqa.onnx` session.

    Args:
        session: the `decode_gqa.onnx` onnxruntime session (it must take a per-row `index`).
        spec: the manifest's `decoding.gqa` entry (`layers`, `kv_heads`, `key_dim`,
            `max_length`).
        pad_token_id: the id never generated (manifest `decoding.pad_token_id`); None: no id
            is banned.
        max_decode_rows: requests decoded together at most; more wait for a row.
        prefix_cache_bytes: the most bytes of prompt keys and values kept for prompts that
            begin the same way (`prefix_cache.PrefixCache`); 0 keeps none.
    """

    def __init__(self, session: "ort.InferenceSession", spec: dict[str, Any],
                 pad_token_id: int | None, max_decode_rows: int = 32,
                 prefix_cache_bytes: int = 0) -> None:  # fmt: skip
        rows = max_decode_rows
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
            raise ValueError(f"`max_decode_rows` must be a positive integer. Received: {rows!r}")
        self.session, self.spec, self.pad_token_id = session, spec, pad_token_id
        self.max_length = int(spec["max_length"])
        width = session.get_outputs()[0].shape[-1]  # the logits' width: ids the model embeds
        self.vocabulary_size = width if isinstance(width, int) else None
        self.cache = BucketedCache(session, spec, max_decode_rows)
        self.prefill = BucketedCache(session, spec, min(max_decode_rows, PREFILL_ROWS))
        self.max_decode_rows = max_decode_rows
        self.prefix = PrefixCache(prefix_cache_bytes)
        self.active: list[_Request] = []
        self.waiting: deque[_Request] = deque()
        self.lock = threading.Condition()
        self.closed = False
        self.steps = 0  # batched decode steps run (for tests and metrics)
        self.rows_stepped = 0  # requests advanced by them
        self.peak_rows = 0  # the most requests one step has advanced
        self.pending: list[tuple[_LoopSink, Any]] = []  # for `astream`s, put by the loop
        self.thread = threading.Thread(target=self._loop, name="decode-batcher", daemon=True)
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
        if len(prompt) + max_new_tokens > self.max_length:
            raise ValueError(
                f"prompt length {len(prompt)} + max_new_tokens {max_new_tokens} exceeds the "
                f"model's maximum sequence length {self.max_length}"
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
            # By length: each prefill run pads its prompts to the longest of them.
            live = sorted((r for r in newcomers if not r.cancelled), key=lambda r: len(r.prompt))
            try:
                for request in newcomers:
                    if request.cancelled:
                        request.done = True
                        request.out.put(_END)
                misses = [r for r in live if not self._admit_cached(r)]
                for start in range(0, len(misses), PREFILL_ROWS):
                    self._admit_each(misses[start : start + PREFILL_ROWS])
                _flush(self.pending)  # first ids of prompts prefilled whole, before the step
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

    def _check_ids(self, prompt: list[int]) -> None:
        """Ids the model has no embedding for are refused before they join a shared step."""
        vocabulary = self.vocabulary_size
        if vocabulary is not None and not 0 <= min(prompt) <= max(prompt) < vocabulary:
            bad = sorted({t for t in prompt if not 0 <= t < vocabulary})
            raise ValueError(f"`prompt` has ids outside [0, {vocabulary}): {bad[:5]}")

    def _admit_each(self, requests: list[_Request]) -> None:
        """`_admit`, with rows isolated: when a prefill run fails, each of its prompts is
        tried alone, and only a prompt that fails alone gets the error."""
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

    def _run(self, cache: BucketedCache, rows: int, token_ids: np.ndarray, index: np.ndarray
             ) -> np.ndarray:  # fmt: skip
        binding = cache.bindings[rows]
        binding.bind_cpu_input("token_ids", np.ascontiguousarray(token_ids, np.int32))
        binding.bind_cpu_input("index", np.ascontiguousarray(index, np.int32))
        self.session.run_with_iobinding(binding)
        return binding.get_outputs()[0].numpy()

    def _admit(self, requests: list[_Request]) -> None:
        """Prefills `requests` together and gives each a row of the shared cache. Prompts of
        one length are prefilled whole, and the run's logits give their first ids; else all
        of each prompt but its last id is, and the last id is its token in the next step."""
        whole = len({len(r.prompt) for r in requests}) == 1
        width = max(len(r.prompt) for r in requests) - (not whole)
        logits = None
        if width:
            rows = self.prefill.bucket(len(requests))
            token_ids = np.full((rows, width), self.pad_token_id or 0, np.int32)
            for k, request in enumerate(requests):
                ids = request.prompt if whole else request.prompt[:-1]
                token_ids[k, : len(ids)] = ids
            logits = self._run(self.prefill, rows, token_ids, np.zeros(rows, np.int32))
        greedy = None if logits is None or not whole else self._greedy(logits[: len(requests)])
        for k, request in enumerate(requests):
            request.position = len(request.prompt) - (not whole)
            request.next_token = request.prompt[-1]
            row = len(self.active)
            self.cache.copy_row(self.prefill, k, row, request.position)
            self.prefix.store(request.prompt, request.position, self.prefill.buffers, k)
            self.active.append(request)
            if whole:
                assert logits is not None and greedy is not None
                self._choose(row, request, logits[k], greedy[k])

    def _admit_cached(self, request: _Request) -> bool:
        """Admits `request` from the prefix cache when its prompt begins with held blocks:
        their keys and values are copied, and only the rest of the prompt is run (alone: a
        run that continues a cached prefix takes one row), or, when one id is left, it goes
        through the next shared step. False (nothing done) on a miss; a failure is the
        request's alone."""
        if not self.prefix.enabled:
            return False
        prompt = request.prompt
        found, blocks = self.prefix.lookup(prompt, len(prompt) - 1)
        if request.outcome is not None:
            request.outcome["cached_tokens"] = found
        if not found:
            return False
        try:
            suffix = prompt[found:]
            row = len(self.active)
            request.next_token = prompt[-1]
            # One id left: the blocks go straight into the request's row; else into the
            # prefill row the rest of the prompt runs on.
            target, at = (self.cache, row) if len(suffix) == 1 else (self.prefill, 0)
            for n, buffer in enumerate(target.buffers):
                buffer[at, :, :found] = np.concatenate([arrays[n] for arrays in blocks], 1)
            if len(suffix) == 1:
                request.position = found
                self.active.append(request)
                return True
            logits = self._run(self.prefill, 1, np.array([suffix], np.int32),
                               np.array([found], np.int32))  # fmt: skip
            request.position = len(prompt)
            self.cache.copy_row(self.prefill, 0, row, len(prompt))
            self.prefix.store(prompt, len(prompt), self.prefill.buffers, 0)
            self.active.append(request)
            self._choose(row, request, logits[0], self._greedy(logits[:1])[0])
        except Exception as error:
            _fail(request, error)  # first: the error reaches it before its end
            if request in self.active:
                self._finish(self.active.index(request))
        return True

    def _step(self) -> None:
        count = len(self.active)
        rows = self.cache.bucket(count)
        token_ids = np.full((rows, 1), self.pad_token_id or 0, np.int32)
        index = np.zeros(rows, np.int32)
        for row, request in enumerate(self.active):
            token_ids[row, 0], index[row] = request.next_token, request.position
        logits = self._run(self.cache, rows, token_ids, index)
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
        """A copy of `logits` (`(rows, vocab)`) as `dtype`, the pad id never chosen."""
        logits = np.array(logits, dtype)
        if self.pad_token_id is not None:
            logits[:, self.pad_token_id] = -np.inf
        return logits

    def _choose(self, row: int, request: _Request, logits: np.ndarray, greedy: int) -> None:
        """Picks `request`'s next id (`greedy`, or its sampler's draw from its float64
        logits); sends it, or ends the request."""
        if request.sampler is None:
            token = int(greedy)
        else:
            try:  # a request's own chooser (a grammar, say) fails that request alone
                token = int(request.sampler(self._banned(logits[None], np.float64))[0])
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

    def _finish(self, row: int) -> None:
        """Ends the request in `row`; the last active request moves into its row."""
        request = self.active[row]
        request.done = True
        request.out.put(_END)
        last = len(self.active) - 1
        if row != last:
            moved = self.active[last]
            self.cache.copy_row(self.cache, last, row, moved.position)
            self.active[row] = moved
        self.active.pop()
