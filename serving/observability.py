"""Prometheus metrics (one registry per app) and JSON-lines logs for the server."""

import json
import logging
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


class Metrics:
    """Requests, latency, errors, batch sizes and queue depth, served at `/metrics`."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        labels = ("route", "status")
        self.requests = Counter("keras_attn_requests", "HTTP requests answered", labels,
                                registry=self.registry)  # fmt: skip
        self.errors = Counter("keras_attn_errors", "HTTP requests answered with status >= 400",
                              labels, registry=self.registry)  # fmt: skip
        self.latency = Histogram("keras_attn_request_latency_seconds", "request latency",
                                 ("route",), buckets=LATENCY_BUCKETS,
                                 registry=self.registry)  # fmt: skip
        self.in_flight = Gauge("keras_attn_in_flight_requests", "requests being answered",
                               registry=self.registry)  # fmt: skip
        self.batch_size = Histogram("keras_attn_batch_size", "rows per onnxruntime call",
                                    ("model",), buckets=BATCH_BUCKETS,
                                    registry=self.registry)  # fmt: skip
        self.queue_depth = Gauge("keras_attn_queue_depth", "requests waiting for a batch",
                                 ("model",), registry=self.registry)  # fmt: skip
        self.positions = Counter("keras_attn_batch_positions",
                                 "sequence positions computed by merged calls", ("model",),
                                 registry=self.registry)  # fmt: skip
        self.padding = Counter("keras_attn_batch_padding_positions",
                               "of those, positions that were padding", ("model",),
                               registry=self.registry)  # fmt: skip
        self.batch_cap = Gauge("keras_attn_batch_cap", "rows merged at most, tuned under load",
                               ("model",), registry=self.registry)  # fmt: skip
        self.prefix_cache_bytes = Gauge("keras_attn_prefix_cache_bytes",
                                        "prompt keys/values held for shared prefixes",
                                        ("model",), registry=self.registry)  # fmt: skip
        self.prefix_cache_hit_tokens = Gauge("keras_attn_prefix_cache_hit_tokens",
                                             "prompt positions served from the prefix cache "
                                             "since the model loaded", ("model",),
                                             registry=self.registry)  # fmt: skip

    def observe(self, route: str, status: int, seconds: float) -> None:
        self.requests.labels(route, str(status)).inc()
        if status >= 400:
            self.errors.labels(route, str(status)).inc()
        self.latency.labels(route).observe(seconds)

    def on_batch(self, model: str) -> Callable[[int, int, int, int, int], None]:
        def record(rows: int, depth: int, cap: int, positions: int, padding: int) -> None:
            self.batch_size.labels(model).observe(rows)
            self.positions.labels(model).inc(positions)
            self.padding.labels(model).inc(padding)
            self.queue_depth.labels(model).set(depth)
            self.batch_cap.labels(model).set(cap)

        return record

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and any `extra` fields."""

    RESERVED = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message"}

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update({k: v for k, v in vars(record).items() if k not in self.RESERVED})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure_logging(level: str = "info") -> None:
    """JSON lines on stderr for the server's and uvicorn's loggers."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    for name in ("keras_attn.serve", "uvicorn", "uvicorn.error"):
        logger = logging.getLogger(name)
        logger.handlers = [handler]
        logger.setLevel(level.upper())
        logger.propagate = False
