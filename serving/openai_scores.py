"""What an OpenAI request asks of each choice beyond its text: `logprobs` (checked, and
formatted from `choosers.Choice.scores` in chat's and completions' shapes) and JSON output
(one llguidance matcher per choice, built off the event loop)."""

from typing import TYPE_CHECKING, Any

from keras_attn_serving.choosers import (
    MAX_TOP_LOGPROBS,
    Choice,
    Grammar,
    json_grammar,
    model_grammar_tokenizer,
)
from keras_attn_serving.detokenizer import Detokenizer, text_of
from keras_attn_serving.flow import Flow
from keras_attn_serving.protocol import ServingError, shown
from keras_attn_serving.text import TextModel

if TYPE_CHECKING:
    from keras_attn_serving.generation_request import GenerationRequest


def _chat_logprobs(payload: dict[str, Any]) -> int | None:
    """How many alternatives chat's `logprobs` / `top_logprobs` ask for; None: no scores."""
    wanted, top = payload.get("logprobs"), payload.get("top_logprobs")
    if wanted is not None and not isinstance(wanted, bool):
        raise ServingError(400, f"`logprobs` must be true or false; received "
                                f"{shown(wanted)}"[:200], param="logprobs")  # fmt: skip
    if top is not None and (isinstance(top, bool) or not isinstance(top, int)
                            or not 0 <= top <= MAX_TOP_LOGPROBS):  # fmt: skip
        raise ServingError(400, f"`top_logprobs` must be an integer in [0, {MAX_TOP_LOGPROBS}]"
                                f"; received {shown(top)}"[:200], param="top_logprobs")  # fmt: skip
    if top is not None and not wanted:
        raise ServingError(400, "`top_logprobs` needs `logprobs: true`", param="top_logprobs")
    return (top or 0) if wanted else None


def _completion_logprobs(payload: dict[str, Any]) -> int | None:
    """Completions' `logprobs`: how many alternatives (0 to 5); None: no scores."""
    top = payload.get("logprobs")
    if top is None or top is False:
        return None
    if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= 5:
        raise ServingError(400, f"`logprobs` must be an integer in [0, 5]; received "
                                f"{shown(top)}"[:200], param="logprobs")  # fmt: skip
    return top


def _chosen(model: TextModel, checked: list["GenerationRequest"], top: int | None,
            grammars: list[Grammar] | None) -> list["GenerationRequest"]:  # fmt: skip
    """The requests, their samplers wrapped in a `Choice` where scores or a grammar are
    asked for (a grammar's end is the model's first end-of-turn id, a stop id)."""
    if top is None and grammars is None:
        return checked
    end = model.predictor.end_token_ids[0] if model.predictor.end_token_ids else None
    for i, one in enumerate(checked):
        grammar = grammars[i] if grammars else None
        one.sampler = Choice(one.sampler, top, grammar, end)  # type: ignore[assignment]
        if grammar is not None and end not in one.stop_ids:
            one.stop_ids = [*one.stop_ids, end]  # type: ignore[list-item]
    return checked


def _grammars(model: TextModel, response_format: dict[str, Any], n: int) -> list[Grammar]:
    """`n` matchers of a JSON `response_format` (one per choice: each keeps its own state);
    run off the event loop: compiling a schema, and at first the vocabulary, takes time."""
    if not model.predictor.end_token_ids:
        raise ServingError(400, "JSON output needs a model with an end-of-turn id (its "
                                "generation_config.json's eos_token_id)",
                           param="response_format")  # fmt: skip
    try:
        grammar = json_grammar(response_format)
        tokenizer = model_grammar_tokenizer(model)
        return [Grammar(tokenizer, grammar) for _ in range(n)]
    except ValueError as error:
        raise ServingError(400, str(error), param="response_format") from None


def _token(model: TextModel, token: int) -> tuple[str, bytes]:
    """`(text, bytes)` of one id: a token that is part of a character is written as OpenAI
    writes it, `bytes:\\xe6\\x9c`, with its own bytes beside (ids past the tokenizer: none)."""
    if not 0 <= token < model.words.vocabulary_size:
        return "", b""
    raw = model.words.token_bytes(token)
    try:
        return raw.decode("utf-8"), raw
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw), raw


def _entry(model: TextModel, token: int, logprob: float) -> dict[str, Any]:
    text, raw = _token(model, token)
    return {"token": text, "logprob": logprob, "bytes": list(raw)}


def _scores(flow: Flow, start: int, end: int) -> list[tuple[int, float, Any]] | None:
    choice = flow.request.sampler
    if not isinstance(choice, Choice) or choice.top_logprobs is None:
        return None
    end = min(end, len(flow.ids), len(choice.scores))
    return [(flow.ids[i], *choice.scores[i]) for i in range(start, end)]


def _chat_scores(model: TextModel, flow: Flow, start: int, end: int) -> dict[str, Any] | None:
    """Chat's `logprobs` of the ids `start:end` a flow sent: `{"content": [...]}`."""
    scores = _scores(flow, start, end)
    if scores is None:
        return None
    return {"content": [
        {**_entry(model, token, logprob),
         "top_logprobs": [_entry(model, i, lp) for i, lp in top]}
        for token, logprob, top in scores
    ]}  # fmt: skip


class Offsets:
    """Where each id a completion sent starts in its `text` (after an echoed prompt of
    `start` characters): the characters the ids before it added, as its text was built
    (`Detokenizer`), kept as ids come, so a stream's chunks cost one id each."""

    def __init__(self, model: TextModel, prompt: list[int], start: int) -> None:
        self.words = Detokenizer(text_of(model.words), model.context(prompt))
        self.starts: list[int] = []
        self.end = start

    def upto(self, ids: list[int], count: int) -> list[int]:
        while len(self.starts) < min(count, len(ids)):
            self.starts.append(self.end)
            self.end += len(self.words.push(ids[len(self.starts) - 1]))
        return self.starts


def _completion_scores(model: TextModel, flow: Flow, start: int, end: int
                       ) -> dict[str, Any] | None:  # fmt: skip
    """Completions' `logprobs` of the ids `start:end`: tokens, their log-probabilities, the
    alternatives (the likelier kept where two read alike) and each token's character offset
    in the choice's `text` (`flow.offsets`, set by the route)."""
    scores = _scores(flow, start, end)
    if scores is None:
        return None
    offsets = flow.offsets.upto(flow.ids, start + len(scores)) if flow.offsets else []
    alternatives = []
    for _, _, top in scores:
        one: dict[str, float] = {}
        for i, lp in top:  # most likely first
            one.setdefault(_token(model, i)[0], lp)
        alternatives.append(one)
    return {"tokens": [_token(model, token)[0] for token, _, _ in scores],
            "token_logprobs": [lp for _, lp, _ in scores],
            "top_logprobs": alternatives,
            "text_offset": offsets[start : start + len(scores)]}  # fmt: skip
