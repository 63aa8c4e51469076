"""The `parameters` of a `/generate` request, checked: how many tokens, when to stop, and how
to choose each token (greedy, or sampled as Keras-side `generate` samples).

Sampling is on when any of `temperature`, `top_k`, `top_p` or `seed` is given, with the
semantics of `keras_attn.decoding.decode(sampler="sample")` (temperature, then top-k, then
top-p; one seeded draw per step): the same seed gives the same ids as Keras `generate` on the
same prompt. Every bad value is a `ServingError` 400 naming the parameter.
"""

import dataclasses
from typing import Any

from keras_attn_serving.protocol import ServingError, finite_number, shown
from keras_attn_serving.sampling import Sampler

MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 200
DEFAULT_MAX_TOKENS = 20
SAMPLING = ("temperature", "top_k", "top_p", "seed")


@dataclasses.dataclass
class GenerationRequest:
    max_tokens: int
    stop_ids: list[int]
    stop_strings: list[str]
    sampler: Sampler | None  # None: greedy


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _refuse(name: str, rule: str, value: Any) -> ServingError:
    return ServingError(400, f"`{name}` must be {rule}; received {shown(value)}"[:300])


def generation_request(
    parameters: dict[str, Any], vocabulary_size: int, end_token_ids: list[int] | None = None
) -> GenerationRequest:
    """`parameters` (already limited to the known names) as a `GenerationRequest`. Without
    `stop_token_ids` a generation ends at the model's `end_token_ids` (the checkpoint's end
    of turn); `temperature: 0` means greedy, as OpenAI-style clients send it."""
    if "max_tokens" in parameters and "max_new_tokens" in parameters:
        raise ServingError(400, "give `max_new_tokens` or `max_tokens` (the same), not both")
    name = "max_new_tokens" if "max_new_tokens" in parameters else "max_tokens"
    max_tokens = parameters.get(name, DEFAULT_MAX_TOKENS)
    if not _integer(max_tokens) or max_tokens < 1:
        raise _refuse(name, "an integer >= 1", max_tokens)
    stop_ids = parameters.get("stop_token_ids", list(end_token_ids or []))
    if not isinstance(stop_ids, list) or not all(
        _integer(t) and 0 <= t < vocabulary_size for t in stop_ids
    ):
        raise _refuse("stop_token_ids", f"a list of ids in [0, {vocabulary_size})", stop_ids)
    stop = parameters.get("stop", [])
    stop = [stop] if isinstance(stop, str) else stop
    if (
        not isinstance(stop, list)
        or len(stop) > MAX_STOP_STRINGS
        or not all(
            (_integer(s) and 0 <= s < vocabulary_size)
            or (isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS)
            for s in stop
        )
    ):
        raise _refuse(
            "stop", f"a string or a list of at most {MAX_STOP_STRINGS} strings (1 to "
            f"{MAX_STOP_CHARS} characters) and ids in [0, {vocabulary_size})", stop,
        )  # fmt: skip
    stop_ids = stop_ids + [s for s in stop if not isinstance(s, str)]
    stop_strings = [s for s in stop if isinstance(s, str)]
    sampler = None
    if any(key in parameters for key in SAMPLING):
        sampler = _sampler(parameters)
        if parameters.get("temperature") == 0:  # the limit of sampling: greedy
            sampler = None
    return GenerationRequest(max_tokens, stop_ids, stop_strings, sampler)


def _sampler(parameters: dict[str, Any]) -> Sampler:
    temperature = parameters.get("temperature", 1.0)
    if not finite_number(temperature) or temperature < 0:
        raise _refuse("temperature", "a finite number >= 0 (0: greedy)", temperature)
    top_k = parameters.get("top_k")
    if top_k is not None and (not _integer(top_k) or top_k < 1):
        raise _refuse("top_k", "an integer >= 1", top_k)
    top_p = parameters.get("top_p")
    if top_p is not None and (not finite_number(top_p) or not 0 < top_p <= 1):
        raise _refuse("top_p", "a number in (0, 1]", top_p)
    seed = parameters.get("seed")
    if seed is not None and (not _integer(seed) or not 0 <= seed < 2**63):
        raise _refuse("seed", "an integer in [0, 2**63)", seed)
    return Sampler("sample", float(temperature) or 1.0, top_k, top_p, seed)
