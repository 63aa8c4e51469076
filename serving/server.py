"""HTTP inference server over exported artifact folders: KServe v2 (Open Inference Protocol)
JSON and TF Serving REST, on onnxruntime. Never imports tensorflow or keras.

    keras-attn-serve --model-repository DIR --port 8000

`DIR/NAME/VERSION/` are artifact folders written by `keras_attn_export.export_model` (Triton's
repository layout; VERSION is a positive integer). Each file's sha256 is checked against
its `manifest.json` before the model loads; the newest version answers when none is named.

The parts: `repository` (models and their batchers; `folders`, what it reads on disk),
`handling` (limits, errors, the call through a batcher), one router per protocol
(`routes_v2`, `routes_text`, `routes_tfs`) and `cli` (flags and `main`; `python -m
keras_attn_serving` runs it).
"""

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from keras_attn_serving.handling import Gate, install_error_handlers, log
from keras_attn_serving.repository import ModelRepository
from keras_attn_serving.settings import ServerSettings

if TYPE_CHECKING:
    from fastapi import FastAPI

__all__ = ["ModelRepository", "create_app"]


def create_app(
    repository: ModelRepository | str | Path,
    settings: ServerSettings | None = None,
    **overrides: Any,
) -> "FastAPI":
    """The FastAPI application serving `repository` (a `ModelRepository` or a folder).

    `settings` is a `ServerSettings` (its `model_repository` is ignored when `repository` is
    a `ModelRepository`); keyword `overrides` replace single settings, e.g.
    `create_app(folder, max_body_bytes=1024)`.
    """
    from fastapi import FastAPI
    from fastapi.responses import Response
    from keras_attn_serving import (
        routes_openai,
        routes_repository,
        routes_rerank,
        routes_text,
        routes_tfs,
        routes_v2,
    )
    from keras_attn_serving.observability import Metrics
    from keras_attn_serving.offload import Offload, Tokenizing

    root = repository.root if isinstance(repository, ModelRepository) else repository
    if settings is None:
        settings = ServerSettings(model_repository=Path(root), **overrides)
    elif overrides:
        settings = settings.model_copy(update=overrides)
    metrics = Metrics()
    if not isinstance(repository, ModelRepository):
        repository = ModelRepository(
            repository, settings.verify_sha256, settings.session_threads,
            settings.max_batch_size, settings.max_delay_ms, settings.batch_workers,
            max_decode_rows=settings.max_decode_rows, decode_threads=settings.decode_threads,
            prefix_cache_bytes=settings.prefix_cache_bytes,
            batch_schedule=settings.batch_schedule, batch_min_fill=settings.batch_min_fill,
        )  # fmt: skip
    if repository.on_batch is None:
        repository.on_batch = metrics.on_batch

    offload = Offload(settings.offload_processes, timeout_s=settings.request_timeout_s)
    tokenizing = Tokenizing(settings.tokenize_threads, settings.tokenize_timeout_s)

    @contextlib.asynccontextmanager
    async def lifespan(app: "FastAPI") -> AsyncIterator[None]:
        log.info("serving", extra={"repository": str(repository.root),
                                   "models": repository.names()})  # fmt: skip
        await asyncio.to_thread(offload.start)
        sweeping = asyncio.create_task(_sweep(repository, settings.repository_poll_s))
        yield
        sweeping.cancel()
        # uvicorn has stopped accepting and waited for in-flight requests (SIGTERM drain);
        # queued batches finish before the process exits.
        await asyncio.to_thread(repository.close)
        await asyncio.to_thread(offload.close)
        tokenizing.close()
        log.info("drained")

    docs: dict[str, Any] = (
        {} if settings.openapi else {"docs_url": None, "redoc_url": None, "openapi_url": None}
    )
    app = FastAPI(title="keras-attn-serve", lifespan=lifespan, **docs)
    app.state.repository = repository
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.offload = offload
    app.state.tokenizing = tokenizing
    app.add_middleware(Gate, settings=settings, metrics=metrics, log=log, direct=routes_v2.DIRECT)
    install_error_handlers(app)

    @app.get("/metrics")
    def prometheus_metrics():
        for name, _, predictor, batcher in repository.loaded():
            metrics.queue_depth.labels(name).set(batcher.queue_depth)
            decoder = predictor.decode_batcher
            if decoder is not None:
                metrics.prefix_cache_bytes.labels(name).set(decoder.prefix.bytes)
                metrics.prefix_cache_hit_tokens.labels(name).set(decoder.prefix.hit_tokens)
        return Response(metrics.exposition(), media_type="text/plain; version=0.0.4")

    for module in (
        routes_v2,
        routes_text,
        routes_openai,
        routes_rerank,
        routes_tfs,
        routes_repository,
    ):
        app.include_router(module.router)
    return app


async def _sweep(repository: ModelRepository, every_s: float) -> None:
    """Unloads removed versions every `every_s` seconds, for as long as the server runs."""
    while True:
        await asyncio.sleep(every_s)
        try:
            await asyncio.to_thread(repository.sweep)
        except OSError:  # the repository folder itself went away: nothing loads either
            log.warning("repository sweep failed", exc_info=True)
