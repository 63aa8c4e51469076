"""Work too heavy for the event loop: parsing a large JSON body and encoding a large JSON
answer run in worker processes, because `json.loads`/`json.dumps` hold the GIL for the whole
call (34 MB of numbers: 0.78 s; a 1,024-row float answer: seconds), and a thread would stall
every other request, health checks included, just as long.

Small bodies and answers stay on the event loop: a process round trip costs more than
parsing them (under `inline_bytes`, 128 KiB by default, about 3 ms of parsing at most).
The functions sent to a worker are module-level and return plain data or NumPy arrays, which
pickle as one buffer copy; `ServingError` pickles with its status.

Workers are spawned, so, as with any spawned `multiprocessing` process, a script that builds
and runs the server itself must do so under `if __name__ == "__main__":` (a worker imports
the script's module). `keras-attn-serve` and `python -m keras_attn_serving` do. A worker pool
that cannot start is logged once, and the work then runs in threads.
"""

import asyncio
import concurrent.futures
import json
import logging
import multiprocessing
import pickle
import queue
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

from keras_attn_serving.protocol import ServingError

log = logging.getLogger("keras_attn.serve")
T = TypeVar("T")
# A number written as JSON: about 20 characters (a float32 as a Python float), each costing
# more to write than to read. Answers are sized with it for `Offload.run`.
JSON_BYTES_PER_VALUE = 20


class Offload:
    """A lazily started pool of `processes` worker processes for calls on large data.

    Args:
        processes: worker processes (spawned, so they share nothing with the server's
            onnxruntime threads). They live as long as the pool: Python 3.11's
            `max_tasks_per_child` can leave calls waiting forever (CPython gh-115634).
        inline_bytes: data smaller than this is handled in the calling thread.
        timeout_s: the longest a call may take in a worker (then a `ServingError` 503).
    """

    def __init__(
        self, processes: int = 1, inline_bytes: int = 128 << 10, timeout_s: float = 60.0
    ) -> None:
        if processes < 1:
            raise ValueError(f"`processes` must be >= 1. Received: processes={processes}")
        self.processes = processes
        self.inline_bytes = inline_bytes
        self.timeout_s = timeout_s
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()
        self.threads_only = False  # set when the workers could not start

    def _executor(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(
                    self.processes, mp_context=multiprocessing.get_context("spawn")
                )
            return self._pool

    def start(self, timeout_s: float = 120.0) -> bool:
        """Starts the workers now and waits for them (a first call otherwise waits for its
        worker's start); returns whether they run. If they cannot start, work runs in
        threads from then on."""
        try:
            futures = [self._executor().submit(int) for _ in range(self.processes)]
            for future in futures:
                future.result(timeout_s)
            return True
        except (BrokenProcessPool, OSError, RuntimeError, TimeoutError):
            log.error(
                "the offload worker processes could not start; large bodies and answers are "
                "handled in threads instead. A script that runs the server itself must do "
                "so under `if __name__ == '__main__':` (the workers are spawned)",
                exc_info=True,
            )
            self.close()
            self.threads_only = True
            return False

    async def run(self, size: int, function: Callable[..., T], *args: Any) -> T:
        """`function(*args)`: here when `size` (bytes) is under `inline_bytes`, else in a
        worker process, within `timeout_s`."""
        timeout_s = self.timeout_s
        if size < self.inline_bytes:
            return function(*args)
        if self.threads_only:
            return await asyncio.to_thread(function, *args)
        loop = asyncio.get_running_loop()
        pool = self._executor()
        try:
            return await asyncio.wait_for(loop.run_in_executor(pool, function, *args), timeout_s)
        except TimeoutError:
            raise ServingError(503, f"the worker process took over {timeout_s:g} s") from None
        except (RecursionError, pickle.PicklingError):
            # Parsed, but too deeply nested to send back (pickle's limit is below JSON's).
            raise ServingError(400, "the request is nested too deeply") from None
        except BrokenProcessPool:
            # A worker died (killed for memory): a new pool takes the next call.
            with self._lock:
                if self._pool is pool:
                    self._pool = None
            pool.shutdown(wait=False, cancel_futures=True)
            raise ServingError(503, "a worker process was restarted; retry the request") from None

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            try:
                pool.shutdown(wait=True, cancel_futures=True)
            except BrokenProcessPool:
                pass


def dumps(value: Any) -> bytes:
    return json.dumps(value).encode()


class Tokenizing:
    """Tokenization off the event loop, in `threads` threads of its own, answered within
    `timeout_s`: a text whose cost grows with its length (a tokenizer's backtracking regex)
    holds one of these threads, never the loop nor the default executor. Texts queue for a
    thread as usual; a thread cannot be stopped, so a text past its deadline keeps its thread
    until it ends (`stuck`), and while every thread is held so, new texts get a 503 at once.
    The threads are daemons: one held by such a text never keeps the process from exiting.

    Args:
        threads: tokenizing threads (`tokenizers` releases the GIL while it works).
        timeout_s: the longest a caller waits, queued and running (then a `ServingError`:
            400 for a text still being tokenized, 503 for one that never got a thread).
    """

    def __init__(self, threads: int = 2, timeout_s: float = 10.0) -> None:
        if threads < 1:
            raise ValueError(f"`threads` must be >= 1. Received: threads={threads}")
        self.threads, self.timeout_s, self.stuck = threads, timeout_s, 0
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        for i in range(threads):
            threading.Thread(target=self._work, name=f"tokenize-{i}", daemon=True).start()

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            future, function, args = item
            if not future.set_running_or_notify_cancel():
                continue  # its caller gave up while it waited
            try:
                future.set_result(function(*args))
            except BaseException as error:  # delivered to the caller, who answers it
                future.set_exception(error)

    async def run(self, function: Callable[..., T], *args: Any) -> T:
        if self.stuck >= self.threads:
            raise ServingError(503, "every tokenizing thread is busy with a slow text; retry")
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._queue.put((future, function, args))
        waiting = asyncio.wrap_future(future)
        try:
            async with asyncio.timeout(self.timeout_s):
                return await asyncio.shield(waiting)
        except TimeoutError:
            if future.done():
                return future.result()
            if future.cancel():  # it never started: the server is busy, the text may be fine
                raise ServingError(503, "no tokenizing thread was free in time; retry") from None
            self.stuck += 1
            loop = asyncio.get_running_loop()
            waiting.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved
            future.add_done_callback(lambda _: loop.call_soon_threadsafe(self._unstuck))
            raise ServingError(
                400, f"tokenizing the text took over {self.timeout_s:g} s: the model's "
                     "tokenizer is too slow on it",
            ) from None  # fmt: skip
        except asyncio.CancelledError:
            future.cancel()  # not started yet: never runs
            raise

    def _unstuck(self) -> None:
        self.stuck -= 1

    def close(self) -> None:
        for _ in range(self.threads):
            self._queue.put(None)
