"""Generation for causal LMs: a `CausalLM`, or a user's functional causal LM of our layers
(`keras_attn.models.cached.FunctionalCausalLM`)."""

import inspect
from collections.abc import Sequence
from typing import Any

import keras

from keras_attn.checks import check_known, check_renamed
from keras_attn.decoding import Runner, decode
from keras_attn.models.cached import cached_causal_lm, model_inputs
from keras_attn.types import Tensor


def causal_runner(model: keras.Model) -> Runner:
    """The decoding `Runner` of a causal LM, over its cached call."""
    lm = cached_causal_lm(model)

    def step(
        token_ids: Tensor, state: dict[str, Any], index: int | Tensor
    ) -> tuple[Tensor, dict[str, Any]]:
        logits, caches = lm.call_with_cache(token_ids, state["caches"], index)
        return logits, {"caches": caches}

    def full(token_ids: Tensor, state: dict[str, Any]) -> Tensor:
        return model(model_inputs(model, token_ids), training=False)

    def initial_state(rows: Sequence[int], max_length: int) -> dict[str, Any]:
        return {"caches": lm.init_cache(len(rows), max_length)}

    vocabulary = lm.token_embedding.vocabulary_size
    return Runner(model, step, full, initial_state, vocabulary, lm.max_length)


# What `generate` passes on to `keras_attn.decoding.decode`.
_DECODE_ARGUMENTS = tuple(
    name for name in inspect.signature(decode).parameters
    if name not in ("runner", "prompts", "max_new_tokens")
)  # fmt: skip


def generate(
    model: keras.Model,
    prompts: Any,
    max_new_tokens: int,
    stop_strings: Sequence[str] | str = (),
    **kwargs: Any,
) -> list[list[int]] | list[str] | str:
    """Continues prompts with any sampler: the one public `generate` (`CausalLM.generate`
    calls it). `kwargs` as `keras_attn.decoding.decode` (`sampler`, `temperature`, `top_k`,
    `top_p`, `num_beams`, `stop_token_ids`, `seed`, `use_cache`, `pad_token_id`).

    Args:
        model: a `CausalLM`, or a functional causal LM built from our layers.
        prompts: id lists, a `(batch, seq)` NumPy array or backend tensor; or, for a model
            with a `preprocessor`, a string or a list of strings.
        max_new_tokens: int.
        stop_strings: for string prompts, strings that end the new text: it is cut before
            the first one (the server's `/generate` `stop` does the same).
    Returns:
        a list with the new ids of each prompt; for string prompts, the new text of each.

    Where id 0 is a real token (`mask_zero=False`: GPT-2, the Llama family), no id is padding
    and every id can be generated (GPT-2's end of text is its last id).
    """
    check_renamed(kwargs, ("pad_id",))
    check_known(kwargs, _DECODE_ARGUMENTS, "`generate`")
    preprocessor = getattr(model, "preprocessor", None)
    end_ids = getattr(preprocessor, "end_token_ids", None)
    if kwargs.get("stop_token_ids") is None and end_ids:
        kwargs["stop_token_ids"] = end_ids  # the checkpoint's end of turn
    stop_strings = [stop_strings] if isinstance(stop_strings, str) else list(stop_strings)
    if not all(isinstance(s, str) and s for s in stop_strings):
        raise ValueError(
            f"`stop_strings` must be non-empty strings. Received: stop_strings={stop_strings!r}"
        )
    chats = _conversations(prompts)
    if chats is not None:
        return _generate_chat(model, prompts, chats, max_new_tokens, stop_strings, **kwargs)
    text = isinstance(prompts, str) or (
        isinstance(prompts, (list, tuple)) and bool(prompts)
        and all(isinstance(p, str) for p in prompts)
    )  # fmt: skip
    if text:
        out = _generate_text(model, prompts, max_new_tokens, **kwargs)
        return (
            _cut(out, stop_strings)
            if isinstance(out, str)
            else [_cut(one, stop_strings) for one in out]
        )
    if stop_strings:
        raise ValueError(
            "`stop_strings` apply to text prompts (a model with a preprocessor); with id "
            f"prompts pass `stop_token_ids`. Received: stop_strings={stop_strings!r}"
        )
    runner = causal_runner(model)
    if not cached_causal_lm(model).zero_is_padding:
        kwargs.setdefault("pad_token_id", None)
    return decode(runner, prompts, max_new_tokens, **kwargs)


def _generate_text(model, prompts, max_new_tokens, **kwargs):
    """String prompts through the model's preprocessor: its tokenizer (and the packer's start
    id, as in training), then the new ids detokenized."""
    preprocessor = getattr(model, "preprocessor", None)
    if preprocessor is None:
        raise ValueError(
            "`prompts` are strings, and the model has no preprocessor to tokenize them. Pass "
            "token ids, or give the model `preprocessor=TextPreprocessor(tokenizer, packer)`."
        )
    texts = [prompts] if isinstance(prompts, str) else list(prompts)
    start = getattr(preprocessor.packer, "start_value", None)
    ids = [([start] if start is not None else []) + row
           for row in preprocessor.tokenizer(texts).to_list()]  # fmt: skip
    new = generate(model, ids, max_new_tokens, **kwargs)
    out = [continuation(preprocessor.tokenizer, p, row) for p, row in zip(ids, new, strict=True)]
    return out[0] if isinstance(prompts, str) else out


# What a chat reply drops before its first word; the server drops the same
# (`keras_attn_serving.detokenizer.REPLY_SPACE`, held equal by a test).
REPLY_SPACE = " \t\n\r"


def continuation(tokenizer: Any, prompt: list[int], new: list[int]) -> str:
    """The text `new` ids add to `prompt`'s, as `transformers`' text-generation pipeline
    gives it: the decoding of both, less the prompt's own decoding. The space before a first
    word stays, so prompt + continuation is the whole text (the server's `/generate` and
    `/v1/completions` answer the same)."""
    if not new:
        return ""
    prompt, new = [int(t) for t in prompt], [int(t) for t in new]
    head, whole, alone = (
        tokenizer.detokenize([ids]).numpy()[0].decode("utf-8", errors="replace")
        for ids in (prompt or [0], prompt + new, new)
    )  # fmt: skip
    return whole[len(head) :] if prompt and whole.startswith(head) else alone


def _conversations(prompts: Any) -> list[Any] | None:
    """The conversations in `prompts` (one: a list of message dicts; a batch: a list of
    such lists), or None when `prompts` are not conversations."""
    if not isinstance(prompts, (list, tuple)) or not prompts:
        return None
    if all(isinstance(m, dict) for m in prompts):
        return [list(prompts)]
    if all(isinstance(c, (list, tuple)) and c and all(isinstance(m, dict) for m in c)
           for c in prompts):  # fmt: skip
        return [list(c) for c in prompts]
    return None


def _generate_chat(model, prompts, chats, max_new_tokens, stop_strings, **kwargs):
    """Conversations through the preprocessor's chat template, tokenized with no special
    tokens added (the template writes them, as `transformers` tokenizes a rendered chat);
    the assistant's reply of each, as text."""
    preprocessor = getattr(model, "preprocessor", None)
    if preprocessor is None or not hasattr(preprocessor, "apply_chat_template"):
        raise ValueError(
            "`prompts` are conversations, and the model has no chat preprocessor: load it "
            "with `CausalLM.from_pretrained(folder)` from a folder with a chat template, or "
            "give it `CausalLMPreprocessor(..., chat_template=...)`."
        )
    texts = [preprocessor.apply_chat_template(chat) for chat in chats]
    ids = preprocessor.tokenizer(texts).to_list()
    new = generate(model, ids, max_new_tokens, **kwargs)
    words = preprocessor.tokenizer.detokenize([row or [0] for row in new])
    # The reply as the server sends it: without the leading spaces a byte-level tokenizer
    # puts before its first word.
    out = [_cut(w.decode("utf-8").lstrip(REPLY_SPACE), stop_strings) if row else ""
           for w, row in zip(words.numpy(), new, strict=True)]  # fmt: skip
    single = all(isinstance(m, dict) for m in prompts)
    return out[0] if single else out


def _cut(text: str, stop_strings: Sequence[str]) -> str:
    """`text` up to the first occurrence of any of `stop_strings`."""
    found = [i for i in (text.find(stop) for stop in stop_strings) if i >= 0]
    return text[: min(found)] if found else text
