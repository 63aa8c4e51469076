"""What a Hugging Face folder says about chatting with its model: the chat template and the
special tokens it sees (`keras_attn_serving.chat_template.read_chat_template`), and the ids
that end a turn (`generation_config.json`'s `eos_token_id`, else `config.json`'s; one id or a
list, as `transformers`' `generate` reads them)."""

import os
from typing import Any

from keras_attn_serving.chat_template import ChatTemplate, read_chat_template, read_json_object

MAX_CONFIG_BYTES = 1 << 20


def end_token_ids(folder: str | os.PathLike[str], vocabulary_size: int) -> list[int]:
    """The ids that end a generation, as `transformers` reads them: `generation_config.json`'s
    `eos_token_id` when it has one, else `config.json`'s; an id or a list of ids.

    Raises:
        ValueError: naming the file, when an id is not an integer in `[0, vocabulary_size)`.
    """
    folder = os.fspath(folder)
    for name in ("generation_config.json", "config.json"):
        value = read_json_object(folder, name, MAX_CONFIG_BYTES).get("eos_token_id")
        if value is None:
            continue
        ids = value if isinstance(value, list) else [value]
        if not all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i < vocabulary_size for i in ids
        ):
            raise ValueError(
                f"{name}: `eos_token_id` must be an id or a list of ids in [0, "
                f"{vocabulary_size}). Received: {str(value)[:100]}"
            )
        return list(dict.fromkeys(ids))
    return []


def folder_chat(folder: str | os.PathLike[str], vocabulary_size: int) -> dict[str, Any]:
    """`{"chat_template", "special_tokens", "end_token_ids"}` of a folder: the arguments of
    `CausalLMPreprocessor` that make it chat. The template is compiled here, so a broken
    one is a ValueError at load, not at the first conversation."""
    source, tokens = read_chat_template(folder)
    if source is not None:
        ChatTemplate(source, tokens)
    return {
        "chat_template": source,
        "special_tokens": tokens or None,
        "end_token_ids": end_token_ids(folder, vocabulary_size) or None,
    }
