"""Chat templates: a conversation (`[{"role", "content"}, ...]`) to the prompt text an instruct
model was trained on, rendered as `transformers`' `apply_chat_template` renders it.

The template is the checkpoint's Jinja source (`tokenizer_config.json`'s `chat_template`, a
string or a list of named templates, or `chat_template.jinja`). It runs in Jinja2's immutable
sandbox with the options and helpers `transformers` gives it (`trim_blocks`, `lstrip_blocks`,
loop controls, `raise_exception`, `strftime_now`, a `tojson` that keeps non-ASCII text,
`namespace`, `dict`), and sees the tokenizer's named special tokens (`bos_token`,
`eos_token`, ...) as variables. One module for Keras (`CausalLM.generate` on a conversation),
the exported artifact (the template travels in it, hashed) and the server's chat routes: the
same conversation is the same prompt everywhere.
"""

import datetime
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import jinja2
import jinja2.ext
import jinja2.sandbox

# The named special tokens `transformers` passes to every template (`special_tokens_map`).
SPECIAL_TOKEN_NAMES = (
    "bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token",
)  # fmt: skip
TEMPLATE_FILE = "chat_template.jinja"
MAX_TEMPLATE_CHARS = 1 << 20  # real templates are a few KB; the largest about 30 KB
MAX_MESSAGES = 1024
ROLES_HINT = "system, user, assistant, tool"
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


class ChatTemplateError(ValueError):
    """A template that does not compile, raises (`raise_exception`) or fails while rendering,
    or a conversation it cannot take; the message says which and why."""


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: Any = None, sort_keys: bool = False) -> str:  # fmt: skip
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)  # fmt: skip


def _strftime_now(format: str) -> str:
    return datetime.datetime.now().strftime(format)


class _Dict:
    """`dict(...)` in a template, without the class itself (no attribute access to it)."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


class _Namespace(jinja2.utils.Namespace):
    """`namespace(...)` that refuses underscore names (no way to CPython internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # Jinja's own signature
        self, args = args[0], args[1:]
        attributes = dict(*args, **kwargs)
        for name in attributes:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attributes)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"a chat template cannot set underscore names on a namespace: {name!r}"
            )


def _environment() -> jinja2.sandbox.ImmutableSandboxedEnvironment:
    environment = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    environment.filters["tojson"] = _tojson
    environment.globals.update(
        raise_exception=_raise_exception, strftime_now=_strftime_now, dict=_Dict(),
        namespace=_Namespace,
    )  # fmt: skip
    return environment


MAX_DEPTH = 32  # nesting of message data (a tool call's arguments are a few levels deep)


def _plain(value: Any, where: str, depth: int = 0) -> Any:
    """`value` rebuilt from exact JSON types (the sandbox knows no methods of other objects),
    its strings valid Unicode; anything else is a `ChatTemplateError` naming where it is."""
    if depth > MAX_DEPTH:
        raise ChatTemplateError(f"`{where}` is nested more than {MAX_DEPTH} levels deep")
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as error:  # a lone surrogate such as "\ud800"
            raise ChatTemplateError(
                f"`{where}` is not valid Unicode text: {error.reason} at position {error.start}"
            ) from None
        return str.__str__(value)
    if value is None or type(value) in (int, float, bool):
        return value
    if isinstance(value, Mapping):
        return {_plain(k, where, depth + 1) if isinstance(k, str) else str(k):
                _plain(v, f"{where}.{k}", depth + 1) for k, v in value.items()}  # fmt: skip
    if isinstance(value, (list, tuple)):
        return [_plain(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
    raise ChatTemplateError(
        f"`{where}` must be JSON data (strings, numbers, lists, objects); received "
        f"{type(value).__name__}"
    )


def _text_of(content: list[Any], where: str) -> str:
    """OpenAI's content parts (`[{"type": "text", "text": ...}, ...]`) as one string, as
    vLLM joins them; a part of another kind (an image) is refused, named."""
    texts = []
    for index, part in enumerate(content):
        if not (isinstance(part, dict) and part.get("type") == "text"
                and isinstance(part.get("text"), str)):  # fmt: skip
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise ChatTemplateError(
                f'`{where}[{index}]` must be a text part ({{"type": "text", "text": '
                f"...}}); received type {str(kind)[:40]!r}: this model reads text only"
            )
        texts.append(part["text"])
    return "\n".join(texts)


def check_conversation(messages: Any, where: str = "messages") -> list[dict[str, Any]]:
    """`messages` checked: a non-empty list of objects, each with a string `role` and a
    `content` that is a string, a list of parts or absent/None (an assistant turn that only
    calls tools). Keys whose value is None are dropped, as `transformers` drops them; a list
    of text parts (OpenAI's content form) becomes its text, joined by newlines.

    Raises:
        ChatTemplateError: naming the message and the problem.
    """
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ChatTemplateError(
            f'`{where}` must be a non-empty list of messages ({{"role", "content"}} '
            f"objects); received {type(messages).__name__}"
        )
    if len(messages) > MAX_MESSAGES:
        raise ChatTemplateError(f"`{where}` has {len(messages)} messages; at most {MAX_MESSAGES}")
    checked = []
    for index, message in enumerate(messages):
        name = f"{where}[{index}]"
        if not isinstance(message, Mapping):
            raise ChatTemplateError(
                f"`{name}` must be an object with `role` and `content`; received "
                f"{type(message).__name__}"
            )
        message = {k: v for k, v in _plain(dict(message), name).items() if v is not None}
        if not isinstance(message.get("role"), str) or not message["role"]:
            raise ChatTemplateError(f"`{name}.role` must be a non-empty string ({ROLES_HINT})")
        content = message.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise ChatTemplateError(
                f"`{name}.content` must be a string or a list of parts; received "
                f"{type(content).__name__}"
            )
        if isinstance(content, list):
            message["content"] = _text_of(content, f"{name}.content")
        checked.append(message)
    return checked


class ChatTemplate:
    """A compiled chat template and the special tokens it sees.

    Args:
        source: the template's Jinja source.
        special_tokens: the tokenizer's named special tokens as strings (`bos_token`,
            `eos_token`, ...); other names are ignored.
    Raises:
        ChatTemplateError: the source does not compile (the line and Jinja's message).
    Example:
        >>> chat = ChatTemplate("{% for m in messages %}<{{ m.role }}>{{ m.content }}"
        ...                     "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")
        >>> chat.render([{"role": "user", "content": "hi"}])
        '<user>hi<assistant>'
    """

    def __init__(self, source: str, special_tokens: Mapping[str, str] | None = None) -> None:
        if not isinstance(source, str) or not source:
            raise ChatTemplateError("a chat template must be a non-empty string")
        if len(source) > MAX_TEMPLATE_CHARS:
            raise ChatTemplateError(
                f"the chat template has {len(source)} characters; at most {MAX_TEMPLATE_CHARS}"
            )
        self.source = source
        self.special_tokens = {
            name: str(value) for name, value in (special_tokens or {}).items()
            if name in SPECIAL_TOKEN_NAMES and value is not None
        }  # fmt: skip
        try:
            self._template = _environment().from_string(source)
        except jinja2.exceptions.TemplateSyntaxError as error:
            raise ChatTemplateError(
                f"the chat template does not compile: {error.message} (line {error.lineno})"
            ) from None

    def render(
        self,
        messages: Any,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        **variables: Any,
    ) -> str:
        """The prompt text of a conversation.

        Args:
            messages: a list of `{"role", "content"}` objects (see `check_conversation`).
            add_generation_prompt: end with the header that opens the assistant's turn.
            continue_final_message: end inside the last message (the model continues it);
                not with `add_generation_prompt`.
            **variables: more template variables (`tools`, `documents`, `enable_thinking`, ...).
        Raises:
            ChatTemplateError: the conversation is malformed, or the template raised
                (its own message), or failed while rendering.
        """
        messages = check_conversation(messages)
        if add_generation_prompt and continue_final_message:
            raise ChatTemplateError(
                "`continue_final_message` and `add_generation_prompt` exclude each other: "
                "continue the last message, or open a new assistant turn"
            )
        final = None
        if continue_final_message:
            final = messages[-1].get("content")
            if not isinstance(final, str):
                raise ChatTemplateError("`continue_final_message` needs a last message with text")
            messages[-1]["content"] = final + _CONTINUE_TAG
        context = {**self.special_tokens, **_plain(variables, "variables")}
        context.setdefault("tools", None)
        context.setdefault("documents", None)
        try:
            text = self._template.render(
                messages=messages, add_generation_prompt=add_generation_prompt, **context
            )
        except jinja2.exceptions.TemplateError as error:  # raise_exception, sandbox, syntax
            raise ChatTemplateError(f"the chat template raised: {error}"[:500]) from None
        except Exception as error:  # a template's own bug: a TypeError, a KeyError, ...
            raise ChatTemplateError(
                f"the chat template failed: {type(error).__name__}: {error}"[:500]
            ) from None
        if final is not None:
            tag = _CONTINUE_TAG.strip()
            if final.strip() not in text or tag not in text:
                raise ChatTemplateError(
                    "`continue_final_message`: the template does not show the last message as "
                    "it was given, so it cannot be continued"
                )
            at = text.rindex(tag)
            exact = text[at : at + len(_CONTINUE_TAG)] == _CONTINUE_TAG
            text = text[:at] if exact else text[:at].rstrip()
        return text


def _token_string(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string, or an `AddedToken`
    object with `content`."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def read_json_object(folder: str | os.PathLike[str], name: str,
                     limit: int = 4 * MAX_TEMPLATE_CHARS) -> dict[str, Any]:  # fmt: skip
    """The JSON object in `folder/name` (`{}` when there is no such file).

    Raises:
        ChatTemplateError: (a ValueError) the file is past `limit` bytes, not JSON, or not an
            object, named.
    """
    path = os.path.join(os.fspath(folder), name)
    if not os.path.exists(path):
        return {}
    if os.path.getsize(path) > limit:
        raise ChatTemplateError(f"{name} is larger than {limit} bytes")
    try:
        with open(path, encoding="utf-8") as file:
            value = json.load(file)
    except (ValueError, UnicodeDecodeError) as error:
        raise ChatTemplateError(f"{name} is not valid JSON: {error}") from None
    if not isinstance(value, dict):
        raise ChatTemplateError(f"{name} must hold a JSON object")
    return value


def read_chat_template(folder: str | os.PathLike[str]) -> tuple[str | None, dict[str, str]]:
    """`(template source or None, named special tokens)` of a Hugging Face folder, as
    `transformers` reads them: `chat_template.jinja` first, else `tokenizer_config.json`'s
    `chat_template` (a string, or a list of `{"name", "template"}` of which `default` is
    taken); the special tokens from `tokenizer_config.json`.

    Raises:
        ChatTemplateError: the file is not what `transformers` writes (named).
    """
    folder = os.fspath(folder)
    config = read_json_object(folder, "tokenizer_config.json")
    tokens = {name: s for name in SPECIAL_TOKEN_NAMES
              if (s := _token_string(config.get(name))) is not None}  # fmt: skip
    jinja = os.path.join(folder, TEMPLATE_FILE)
    if os.path.exists(jinja):
        if os.path.getsize(jinja) > 4 * MAX_TEMPLATE_CHARS:
            raise ChatTemplateError(f"{TEMPLATE_FILE} is larger than 4 MiB")
        with open(jinja, encoding="utf-8") as file:
            return file.read(), tokens
    return _named_template(config.get("chat_template")), tokens


def _named_template(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value or None
    if isinstance(value, Sequence) and all(
        isinstance(t, dict) and isinstance(t.get("name"), str)
        and isinstance(t.get("template"), str) for t in value
    ):  # fmt: skip
        named = {t["name"]: t["template"] for t in value}
        if "default" not in named:
            raise ChatTemplateError(
                f"tokenizer_config.json names chat templates {sorted(named)} and none is 'default'"
            )
        return named["default"]
    raise ChatTemplateError(
        "tokenizer_config.json's `chat_template` must be a string or a list of "
        f'{{"name", "template"}} objects; received {type(value).__name__}'
    )
