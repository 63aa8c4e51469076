"""Server settings: flags, `KERAS_ATTN_*` environment variables, or code, in one pydantic
object; and the optional per-model `config.json` beside the version folders."""

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

# A batch waits for rows at most this long; past it the wait is a misconfiguration (a batch
# waiting out the request timeout answers 504).
MAX_DELAY_MS = 1000.0
MAX_BATCH_SIZE = 4096


class ModelConfig(BaseModel):
    """`DIR/NAME/config.json` (optional): batching for that model, overriding the server's."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    max_batch_size: int | None = Field(None, ge=1, le=MAX_BATCH_SIZE)
    max_delay_ms: float | None = Field(None, ge=0, le=MAX_DELAY_MS)
    batch_schedule: Literal["length", "arrival"] | None = None
    batch_min_fill: float | None = Field(None, ge=0, le=1)
    pad_sequences: bool = True  # merge different lengths (only if padding is verified safe)


class ServerSettings(BaseSettings):
    """Everything `keras-attn-serve` can be told; each field also reads `KERAS_ATTN_<NAME>`."""

    model_config = SettingsConfigDict(env_prefix="KERAS_ATTN_", protected_namespaces=())

    model_repository: Path
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    max_body_bytes: int = Field(16 << 20, gt=0)
    max_rows_per_request: int = Field(1024, gt=0, description="rows in one request; more: 413")
    max_output_bytes: int = Field(
        64 << 20, gt=0, description="float32 bytes a request's outputs may hold; more: 413"
    )
    max_text_chars: int = Field(
        100_000, gt=0, description="characters of one text; longer texts are cut (prompts: 413)"
    )
    max_concurrency: int = Field(256, gt=0, description="in-flight requests; more get 503")
    max_connections: int = Field(
        1000, gt=0, description="open connections; past it the oldest idle one is closed"
    )
    max_header_bytes: int = Field(
        64 << 10, gt=0, description="request line and headers; more: 431, connection closed"
    )
    header_timeout_s: float = Field(
        10.0, gt=0, description="to send the request line and headers; then closed"
    )
    send_timeout_s: float = Field(
        30.0, gt=0, le=3600, description="for a client to read any of an answer; then cut off"
    )
    offload_processes: int = Field(
        1, ge=1, description="processes parsing large bodies and encoding large answers"
    )
    repository_poll_s: float = Field(
        2.0, gt=0, description="how often removed version folders are looked for and unloaded"
    )
    request_timeout_s: float = Field(30.0, gt=0, description="per request; then 504")
    tokenize_timeout_s: float = Field(
        10.0, gt=0, le=3600, description="to tokenize one request's texts; then 400"
    )
    tokenize_threads: int = Field(2, ge=1, le=64, description="threads that tokenize texts")
    max_batch_size: int = Field(
        32, ge=1, le=MAX_BATCH_SIZE, description="rows per merged call; 1 = no merging"
    )
    max_delay_ms: float = Field(
        0.0, ge=0, le=MAX_DELAY_MS, allow_inf_nan=False, description="wait for rows, under load"
    )
    batch_workers: int = Field(2, ge=1, description="threads running each model")
    batch_schedule: Literal["length", "arrival"] = Field(
        "length", description="merge the queued requests nearest in length, or in arrival order"
    )
    batch_min_fill: float = Field(
        0.9, ge=0, le=1, description="length schedule: least share of real positions per batch"
    )
    max_decode_rows: int = Field(
        32, ge=0, description="generation requests sharing each decode step; 0 = one at a time"
    )
    prefix_cache_bytes: int = Field(
        256 << 20, ge=0, description="prompt keys/values kept for shared prefixes; 0 = none"
    )
    session_threads: int | None = Field(
        None, ge=1, description="intra-op threads of the other sessions; default: cores // workers"
    )
    decode_threads: int | None = Field(
        None, ge=1, description="intra-op threads of the shared decode loop; default: all cores"
    )
    verify_sha256: bool = True
    openapi: bool = Field(False, description="serve /docs and /openapi.json")
    drain_timeout_s: float = Field(30.0, ge=0, description="SIGTERM: wait for in-flight")
    log_level: str = "info"
