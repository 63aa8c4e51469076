"""The `parameters` of a `/generate` request, checked: how many tokens, when to stop, and how
to choose each token (greedy, or sampled as Keras-side `generate` samples).

Sampling is on when any of `temperature`, `top_k`, `top_p` or `seed` is given, with the
semantics of `keras_attn.decoding.decode(sampler="sample")` (temperature, then top-k, then
top-p; one seeded draw per step): the same seed gives the same ids as Keras `generate` on the
same prompt. Beam search is on with `num_beams` > 1 (`length_penalty`, `early_stopping`,
`no_repeat_ngram_size` as `transformers` defines them; `keras_attn_serving.beam`). Every bad
value is a `ServingError` 400 naming the parameter.
"""

import dataclasses
from typing import Any

from keras_attn_serving.protocol import ServingError, finite_number, shown
from keras_attn_serving.sampling import Sampler

MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 200
DEFAULT_MAX_TOKENS = 20
# One limit, three names: the native routes', and OpenAI's two (chat's newer one).
MAX_NAMES = ("max_new_tokens", "max_tokens", "max_completion_tokens")
SAMPLING = ("temperature", "top_k", "top_p", "seed")
BEAMS = ("num_beams", "length_penalty", "early_stopping", "no_repeat_ngram_size")
MAX_BEAMS = 8  # each beam is a decoding row: the cost of a request grows with them
MAX_NGRAM = 16


@dataclasses.dataclass
class Beams:
    num_beams: int
    length_penalty: float
    early_stopping: bool | str
    no_repeat_ngram_size: int


@dataclasses.dataclass
class GenerationRequest:
    max_tokens: int
    stop_ids: list[int]
    stop_strings: list[str]
    sampler: Sampler | None  # None: greedy
    beams: Beams | None = None  # beam search instead of one choice per step
    reply: bool = False  # a chat reply: the spaces before its first word are dropped


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _refuse(name: str, rule: str, value: Any) -> ServingError:
    return ServingError(400, f"`{name}` must be {rule}; received {shown(value)}"[:300],
                        param=name)  # fmt: skip


def generation_request(
    parameters: dict[str, Any], vocabulary_size: int, end_token_ids: list[int] | None = None
) -> GenerationRequest:
    """`parameters` (already limited to the known names) as a `GenerationRequest`. Without
    `stop_token_ids` a generation ends at the model's `end_token_ids` (the checkpoint's end
    of turn); `temperature: 0` means greedy, as OpenAI-style clients send it."""
    given = [name for name in MAX_NAMES if name in parameters]
    if len(given) > 1:
        raise ServingError(400, f"give `{given[0]}` or `{given[1]}` (the same), not both",
                           param=given[0])  # fmt: skip
    name = given[0] if given else "max_tokens"
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
    beams = _beams(parameters) if any(key in parameters for key in BEAMS) else None
    if beams is not None and sampler is not None:
        raise ServingError(400, "beam search does not sample: give `num_beams` or sampling "
                                f"parameters ({', '.join(SAMPLING)}), not both")  # fmt: skip
    return GenerationRequest(max_tokens, stop_ids, stop_strings, sampler, beams)


def _beams(parameters: dict[str, Any]) -> Beams:
    num_beams = parameters.get("num_beams", 1)
    if not _integer(num_beams) or not 1 <= num_beams <= MAX_BEAMS:
        raise _refuse("num_beams", f"an integer in [1, {MAX_BEAMS}]", num_beams)
    length_penalty = parameters.get("length_penalty", 1.0)
    if not finite_number(length_penalty) or abs(length_penalty) > 100:
        raise _refuse("length_penalty", "a number in [-100, 100]", length_penalty)
    early_stopping = parameters.get("early_stopping", False)
    if not (isinstance(early_stopping, bool) or early_stopping == "never"):
        raise _refuse("early_stopping", 'true, false or "never"', early_stopping)
    size = parameters.get("no_repeat_ngram_size", 0)
    if not _integer(size) or not 0 <= size <= MAX_NGRAM:
        raise _refuse("no_repeat_ngram_size", f"an integer in [0, {MAX_NGRAM}]", size)
    return Beams(num_beams, float(length_penalty), early_stopping, size)


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
