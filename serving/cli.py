"""`keras-attn-serve`: settings from flags, then `KERAS_ATTN_*` variables, then defaults."""

import argparse
import sys
from collections.abc import Sequence

from keras_attn_serving.repository import repository_problem
from keras_attn_serving.settings import ServerSettings


def parse_settings(argv: Sequence[str] | None = None) -> ServerSettings:
    """`ServerSettings` from flags (one per field, e.g. `--max-batch-size`), then
    `KERAS_ATTN_*` environment variables, then the defaults."""
    import pydantic

    parser = argparse.ArgumentParser(
        prog="keras-attn-serve", description="Serve exported models over HTTP (onnxruntime)."
    )
    for name, field in ServerSettings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        help_text = f"{field.description or ''} (env KERAS_ATTN_{name.upper()})".strip()
        if field.annotation is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None,
                                help=help_text)  # fmt: skip
        else:
            parser.add_argument(flag, default=None, metavar=name.upper(), help=help_text)
    args = {k: v for k, v in vars(parser.parse_args(argv)).items() if v is not None}
    try:
        settings = ServerSettings(**args)
    except pydantic.ValidationError as error:
        problems = []
        for item in error.errors():
            name = str(item["loc"][0]) if item["loc"] else "?"
            flag = "--" + name.replace("_", "-")
            if item["type"] == "missing":
                problems.append(f"{flag} is required (or KERAS_ATTN_{name.upper()})")
            else:
                problems.append(f"{flag}: {item['msg']} (received {item.get('input')!r})")
        parser.error("; ".join(problems))
    return settings


def main(argv: Sequence[str] | None = None) -> None:
    import uvicorn
    from keras_attn_serving.connections import uvicorn_options
    from keras_attn_serving.observability import configure_logging
    from keras_attn_serving.server import create_app

    settings = parse_settings(argv)
    problem = repository_problem(settings.model_repository)
    if problem:  # named before anything starts, not as a traceback from inside the server
        sys.exit(f"keras-attn-serve: --model-repository {settings.model_repository}: {problem}")
    configure_logging(settings.log_level)
    app = create_app(settings.model_repository, settings)
    uvicorn.run(
        app, host=settings.host, port=settings.port, log_config=None, access_log=False,
        # uvicorn types it int; it waits float seconds (asyncio.wait_for).
        timeout_graceful_shutdown=settings.drain_timeout_s,  # type: ignore[arg-type]
        **uvicorn_options(settings),
    )  # fmt: skip


if __name__ == "__main__":
    main()
