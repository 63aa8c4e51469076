"""The model repository: artifact folders `ROOT/NAME/VERSION/`, loaded on first use, each with
its batcher (Triton's repository layout; VERSION is a positive integer)."""

import asyncio
import ctypes
import gc
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np
from keras_attn_serving.batching import Batcher
from keras_attn_serving.folders import NAME, folder_signature, is_version, version_numbers
from keras_attn_serving.manifest import MANIFEST, ArtifactError
from keras_attn_serving.predictor import InputError, Predictor
from keras_attn_serving.protocol import ServingError
from keras_attn_serving.settings import ModelConfig

log = logging.getLogger("keras_attn.serve")
MAX_RETRY_S = 60.0  # the longest wait before a failed version is loaded again


def _cores():
    """CPUs this process may run on (a container's share, not the host's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def repository_problem(root: Path) -> str | None:
    """Why `root` cannot be a model repository, or None."""
    if not root.is_dir():
        return "no such folder"
    if (root / MANIFEST).is_file():
        return (
            "this is one exported artifact (it holds manifest.json); a repository holds "
            f"NAME/VERSION/ folders: mkdir -p REPO/NAME && mv {root} REPO/NAME/1, then serve REPO"
        )
    return None


class ModelRepository:
    """The models under `root`, loaded on first use and kept; names and versions are checked
    before they touch the file system, so no request reaches outside `root`.

    Each loaded model gets a `Batcher`; `DIR/NAME/config.json` (a `ModelConfig`) overrides
    the batching arguments for that model.
    """

    def __init__(
        self,
        root: str | Path,
        verify: bool = True,
        num_threads: int | None = None,
        max_batch_size: int = 32,
        max_delay_ms: float = 0.0,
        workers: int = 2,
        on_batch: Callable[[str], Callable[[int, int, int, int, int], None]] | None = None,
        max_decode_rows: int = 32,
        decode_threads: int | None = None,
        batch_schedule: str = "length",
        batch_min_fill: float = 0.9,
        prefix_cache_bytes: int = 256 << 20,
    ) -> None:
        self.root = Path(root).resolve()
        problem = repository_problem(self.root)
        if problem:
            raise ValueError(f"`model_repository` {root}: {problem}")
        self.verify = verify
        # Each of the `workers` threads runs its own batch: together they fill the cores, so
        # onnxruntime's thread pools do not contend for them (2 workers x 2 threads on 2 cores
        # ran 0.56 of raw onnxruntime under load, 2 x 1 thread 0.96: bench/serve_load.py).
        self.num_threads = num_threads or max(1, _cores() // workers)
        self.batching = {"max_batch_size": max_batch_size, "max_delay_ms": max_delay_ms,
                         "workers": workers, "schedule": batch_schedule,
                         "min_fill": batch_min_fill}  # fmt: skip
        # `model name -> callback(rows, queue depth, cap, positions, padding)`
        self.on_batch = on_batch
        self.max_decode_rows = max_decode_rows  # generation requests sharing a decode step
        # The decode loop is one thread: its session gets every core unless this says.
        self.decode_threads = decode_threads
        self.prefix_cache_bytes = prefix_cache_bytes  # each model's shared-prefix cache
        self._loaded: dict[tuple[str, int], _Entry] = {}
        self._failed: dict[tuple[str, int], _Failure] = {}
        self._loading: dict[tuple[str, int], threading.Lock] = {}
        # Loads in progress for `load` (touched only on the event loop).
        self._pending: dict[tuple[str, int], asyncio.Future] = {}
        self._lock = threading.Lock()

    def names(self) -> list[str]:
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and NAME.match(p.name))

    def servable(self) -> bool:
        """Whether any model has a numbered version folder (what readiness needs)."""
        return any(version_numbers(self.root / name) for name in self.names())

    def versions(self, name: str) -> list[int]:
        if not isinstance(name, str) or not NAME.match(name) or ".." in name:
            raise ServingError(400, f"invalid model name {str(name)[:80]!r}")
        versions = version_numbers(os.path.join(self.root, name))
        if versions is None:
            raise ServingError(404, f"unknown model {name!r}")
        if not versions:
            raise ServingError(404, f"model {name!r} has no numbered version folders")
        return versions

    def resolve(self, name: str, version: str | int | None = None) -> tuple[int, Path]:
        """`(version, folder)`: the named version, or the newest."""
        versions = self.versions(name)
        if version is None or version == "":
            chosen = versions[-1]
        else:
            if not is_version(str(version)):
                raise ServingError(400, f"invalid model version {str(version)[:40]!r}")
            chosen = int(version)
            if chosen not in versions:
                raise ServingError(404, f"model {name!r} has no version {chosen}")
        return chosen, self.root / name / str(chosen)

    def get(self, name: str, version: str | int | None = None) -> tuple[int, Predictor]:
        """`(version, predictor)`."""
        chosen, predictor, _ = self.batcher(name, version)
        return chosen, predictor

    def batcher(
        self, name: str, version: str | int | None = None
    ) -> tuple[int, Predictor, Batcher]:
        """`(version, predictor, batcher)`, loaded (or reloaded) here when needed."""
        chosen, folder = self.resolve(name, version)
        return self._loaded_or_load(name, chosen, folder)

    async def load(
        self, name: str, version: str | int | None = None
    ) -> tuple[int, Predictor, Batcher]:
        """`batcher(name, version)` for the event loop: a loaded, unchanged version is
        answered at once; loading and hashing run in a thread."""
        chosen, folder = self.resolve(name, version)
        ready = self._current(name, chosen, folder_signature(folder))
        if ready is not None:
            return chosen, *ready
        # One thread per loading version: the other requests for it await that load
        # instead of each taking a thread of the default pool to wait on its lock.
        key = (name, chosen)
        pending = self._pending.get(key)
        if pending is None:
            pending = asyncio.ensure_future(
                asyncio.to_thread(self._loaded_or_load, name, chosen, folder)
            )
            self._pending[key] = pending
            pending.add_done_callback(lambda _: self._pending.pop(key, None))
        return await asyncio.shield(pending)

    def _current(self, name, chosen, signature):
        """The loaded `(predictor, batcher)` if it is the folder's current content; raises the
        recorded error of a failed load until its retry time (or until the folder changes)."""
        key = (name, chosen)
        with self._lock:
            entry = self._loaded.get(key)
            if entry is not None and entry.signature == signature:
                return entry.predictor, entry.batcher
            failure = self._failed.get(key)
            if failure is not None and failure.signature == signature:
                if time.monotonic() < failure.retry_at:
                    raise ServingError(failure.error.status, failure.error.message)
        return None

    def _loaded_or_load(self, name, chosen, folder):
        key = (name, chosen)
        with self._lock:
            key_lock = self._loading.setdefault(key, threading.Lock())
        with key_lock:  # one load per version at a time: the others wait for it
            signature = folder_signature(folder)
            ready = self._current(name, chosen, signature)
            if ready is not None:
                return chosen, *ready
            failure, predictor = None, None
            try:
                config = self._config(name)  # a bad config.json costs no session
                predictor = Predictor(folder, self.verify, self.num_threads, self.max_decode_rows,
                                      self.decode_threads, self.prefix_cache_bytes)  # fmt: skip
                batcher = self._make_batcher(name, predictor, config)
            except Exception as error:
                failure = self._failed_load(name, chosen, folder, signature, error)
                if predictor is not None:
                    predictor.close()
                predictor = None
            if failure is not None:  # the error, and what it held, are gone: give it back
                gc.collect()
                _trim_heap()
                raise failure
            with self._lock:
                old = self._loaded.pop(key, None)
                self._loaded[key] = _Entry(predictor, batcher, signature)
                self._failed.pop(key, None)
        if old is not None:  # replaced on disk: the new one answers; the old one drains
            log.info("reloaded", extra={"model": name, "version": chosen})
            _retire([old])
        return chosen, predictor, batcher

    def _failed_load(self, name, chosen, folder, signature, error):
        """The `ServingError` for a version that could not load, recorded so that it is not
        loaded (and hashed) again on every request: retried after 1 s, 2 s, 4 s ... 60 s,
        or as soon as its folder changes."""
        if not folder.is_dir():
            return ServingError(404, f"model {name!r} version {chosen} was removed")
        if isinstance(error, ArtifactError):
            reason = str(error)
        else:  # onnxruntime refused the graph, a file vanished while it was read, ...
            log.warning("load failed", exc_info=error, extra={"model": name, "version": chosen})
            reason = f"it could not be loaded ({type(error).__name__})"
        # Triton's answer for a model that is not ready: a 400. The message names the folder
        # by model and version, never by its path on the server.
        reason = reason.replace(str(folder), f"{name}/{chosen}").replace(str(self.root), "")
        message = f"model {name!r} version {chosen} is not ready: {reason}"
        key = (name, chosen)
        with self._lock:
            previous = self._failed.get(key)
            delay = 1.0 if previous is None else min(2 * previous.delay, MAX_RETRY_S)
            # Kept apart from the error raised now, whose traceback holds the request's frames.
            kept = ServingError(400, message)
            self._failed[key] = _Failure(signature, kept, time.monotonic() + delay, delay)
        return ServingError(400, message)

    def sweep(self) -> int:
        """Unloads every loaded version whose folder was removed (its threads and memory
        return); returns how many. The server runs it every `poll_s` seconds."""
        with self._lock:
            loaded, failed = list(self._loaded), list(self._failed)
        # The file system is asked outside the lock, which requests take.
        removed = [k for k in loaded if not (self.root / k[0] / str(k[1]) / MANIFEST).is_file()]
        forgotten = [k for k in failed if not (self.root / k[0] / str(k[1])).is_dir()]
        gone = []
        with self._lock:
            for key in removed:
                if key in self._loaded:
                    gone.append(self._loaded.pop(key))
                    log.info("unloaded", extra={"model": key[0], "version": key[1]})
            for key in removed + forgotten:
                self._failed.pop(key, None)
                self._loading.pop(key, None)
        count = len(gone)
        _retire(gone)
        return count

    def unload(self, name: str) -> int:
        """Unloads every loaded version of `name` (Triton's `unload`); returns how many."""
        with self._lock:
            gone = [self._loaded.pop(k) for k in list(self._loaded) if k[0] == name]
        count = len(gone)
        _retire(gone)
        return count

    def index(self) -> list[dict[str, str]]:
        """Triton's repository index: every version folder, with its state."""
        entries = []
        for name in self.names():
            try:
                versions = self.versions(name)
            except ServingError:
                continue
            for version in versions:
                state, reason = "UNAVAILABLE", "not loaded"
                with self._lock:
                    if (name, version) in self._loaded:
                        state, reason = "READY", ""
                    elif (name, version) in self._failed:
                        reason = self._failed[(name, version)].error.message
                entries.append({"name": name, "version": str(version), "state": state,
                                "reason": reason})  # fmt: skip
        return entries

    def _config(self, name):
        path = self.root / name / "config.json"
        if not path.is_file():
            return ModelConfig()
        try:
            return ModelConfig.model_validate_json(path.read_text())
        except ValueError as error:
            raise ArtifactError(f"config.json: {error}") from None

    def _make_batcher(self, name, predictor, config):
        sequence_inputs = [s["name"] for s in predictor.inputs.values() if _sequence_axis(s)]
        sequence_outputs = [s["name"] for s in predictor.output_specs if _sequence_axis(s)]
        pads = config.pad_sequences and sequence_inputs and _padding_is_safe(
            predictor, sequence_inputs, sequence_outputs
        )  # fmt: skip
        options = dict(self.batching)
        for field, option in (
            ("max_batch_size", "max_batch_size"),
            ("max_delay_ms", "max_delay_ms"),
            ("batch_schedule", "schedule"),
            ("batch_min_fill", "min_fill"),
        ):
            if getattr(config, field) is not None:
                options[option] = getattr(config, field)
        return Batcher(
            predictor.run_checked, **options,
            sequence_inputs=sequence_inputs if pads else (),
            sequence_outputs=sequence_outputs if pads else (),
            on_batch=self.on_batch(name) if self.on_batch else None,
            clock=self._batch_clock(),
        )  # fmt: skip

    def _batch_clock(self) -> Callable[[], float]:
        """CPU seconds where a session has one intra-op thread: its batch computes in the
        worker's thread alone (see `Batcher`'s `clock`); wall seconds otherwise."""
        return time.thread_time if self.num_threads == 1 else time.perf_counter

    def loaded(self) -> list[tuple[str, int, Predictor, Batcher]]:
        """`[(name, version, predictor, batcher)]` of the models loaded so far."""
        with self._lock:
            return [(n, v, e.predictor, e.batcher) for (n, v), e in self._loaded.items()]

    def close(self) -> None:
        """Runs what is queued, then stops every model's batcher (the end of a drain)."""
        for *_, predictor, batcher in self.loaded():
            batcher.close()
            predictor.close()


class _Entry(NamedTuple):
    predictor: Predictor
    batcher: Batcher
    signature: tuple[object, ...] | None


class _Failure(NamedTuple):
    signature: tuple[object, ...] | None
    error: ServingError
    retry_at: float
    delay: float


def _retire(entries):
    """Stops the batchers of unloaded versions (queued requests are answered first) and gives
    their memory back to the system."""
    for entry in entries:
        entry.batcher.close()
        entry.predictor.close()
    if entries:
        del entries[:]
        gc.collect()
        _trim_heap()


def _trim_heap():
    """glibc keeps freed memory for reuse; `malloc_trim` returns it (elsewhere: nothing)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _sequence_axis(spec):
    return len(spec["shape"]) >= 2 and spec["shape"][1] == "sequence"


def _padding_is_safe(predictor, sequence_inputs, sequence_outputs, tolerance=1e-4):
    """Whether zero-padding a request changes nothing at its real positions (the model masks
    id 0), checked once on a probe: length 5 alone vs padded to 8."""
    rng = np.random.default_rng(0)
    high = min(predictor.manifest.vocabulary_size or 50, 50)
    ranges = predictor.manifest.input_ranges
    feeds = {}
    for spec in predictor.inputs.values():
        name = spec["name"]
        shape = [1, 5] + [d if isinstance(d, int) else 2 for d in spec["shape"][2:]]
        # Real positions: ids and masks from 1 (0 is padding), segments and token types
        # from 0; within the manifest's input range (an attention mask's is [0, 2): ones).
        segment = "segment" in name or "type" in name
        low = 1 if name in sequence_inputs and not segment else 0
        high_here = min(ranges[name][1], 50) if name in ranges else (2 if segment else high)
        feeds[name] = rng.integers(low, max(high_here, low + 1), shape).astype(spec["dtype"])
    padded = {
        k: np.pad(v, [(0, 0), (0, 3)] + [(0, 0)] * (v.ndim - 2)) if k in sequence_inputs else v
        for k, v in feeds.items()
    }
    try:
        alone, merged = predictor.run(feeds), predictor.run(padded)
    except (InputError, ValueError):
        return False
    for name, value in alone.items():
        other = merged[name][:, :5] if name in sequence_outputs else merged[name]
        if other.shape != value.shape or not np.allclose(other, value, atol=tolerance):
            return False
    return True
