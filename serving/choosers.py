"""What a request asks of each choice beyond the id: its log-probability and the most likely
alternatives (OpenAI's `logprobs` / `top_logprobs`), and a grammar the text must follow
(`response_format`: JSON, by llguidance). `Choice` is a chooser like `sampling.Sampler`
(`(1, vocab)` float64 logits in, ids out), so the decode loops call it as they call a
sampler, on their own thread, once per step.
"""

from typing import Any

import numpy as np
from keras_attn_serving.sampling import Sampler, log_softmax

MAX_TOP_LOGPROBS = 20  # OpenAI's limit


class Choice:
    """Chooses one id per step as `sampler` does (greedy when None), optionally among the
    ids `grammar` allows, and records `(logprob, [(id, logprob), ...])` of every id chosen in
    `scores` (appended before the id is sent, so a reader of id i finds `scores[i]`).

    Args:
        sampler: a `Sampler`, or None for greedy.
        top_logprobs: None (no scores), or how many alternatives to record (0 to 20).
        grammar: optional `Grammar` (a compiled llguidance matcher).
        end_id: the id returned once the grammar is complete: one of the request's stop ids.
    """

    def __init__(self, sampler: Sampler | None, top_logprobs: int | None = None,
                 grammar: "Grammar | None" = None, end_id: int | None = None) -> None:  # fmt: skip
        if grammar is not None and end_id is None:
            raise ValueError("a grammar needs an end id to stop at")
        self.sampler, self.top_logprobs = sampler, top_logprobs
        self.grammar, self.end_id = grammar, end_id
        self.scores: list[tuple[float, list[tuple[int, float]]]] = []

    def __call__(self, logits: np.ndarray) -> np.ndarray:
        if self.grammar is not None and self.grammar.done:
            return np.array([self.end_id])
        allowed = logits if self.grammar is None else self.grammar.mask(logits)
        if self.grammar is not None and not np.isfinite(allowed).any():
            # Nothing the grammar allows is an id the model can give: end, sending nothing.
            self.grammar.done = True
            return np.array([self.end_id])
        if self.sampler is None:
            chosen = allowed.argmax(-1)
        else:
            chosen = self.sampler(allowed)
        token = int(chosen[0])
        if self.top_logprobs is not None:
            scores = log_softmax(np.asarray(logits[0], np.float64))
            top = np.argsort(-scores, kind="stable")[: self.top_logprobs]
            # Ids that could not be chosen (-inf: banned, or another id forced) are no
            # alternatives, and JSON has no infinity.
            self.scores.append((float(scores[token]), [(int(i), float(scores[i])) for i in top
                                                       if np.isfinite(scores[i])]))  # fmt: skip
        if self.grammar is not None:
            self.grammar.advance(token)
        return np.array([token])


class Grammar:
    """An llguidance matcher over a model's vocabulary: `mask(logits)` sets the ids the
    grammar forbids to -inf; `advance(id)` consumes the chosen id; `done` once the text is
    complete (only an end id may follow).

    Args:
        tokenizer: an `llguidance.LLTokenizer` of the served tokenizer (built once per model).
        grammar: an llguidance grammar (`LLMatcher.grammar_from_json_schema`).
    """

    def __init__(self, tokenizer: Any, grammar: str) -> None:
        import llguidance
        import llguidance.numpy

        self.matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        if self.matcher.is_error():
            raise ValueError(f"the grammar is invalid: {self.matcher.get_error()}"[:300])
        self.end_ids = set(tokenizer.eos_tokens)
        self.bitmask = llguidance.numpy.allocate_token_bitmask(1, tokenizer.vocab_size)
        self.fill = llguidance.numpy.fill_next_token_bitmask
        self.done = False

    def mask(self, logits: np.ndarray) -> np.ndarray:
        self.fill(self.matcher, self.bitmask)
        bits = np.unpackbits(self.bitmask[0].view(np.uint8), bitorder="little")
        width = min(len(bits), logits.shape[-1])
        allowed = np.zeros(logits.shape[-1], bool)
        allowed[:width] = bits[:width].astype(bool)
        return np.where(allowed[None], logits, -np.inf)

    def advance(self, token: int) -> None:
        if token in self.end_ids:
            self.done = True
            return
        if not self.matcher.consume_token(token) or self.matcher.is_stopped():
            self.done = True


def llguidance_tokenizer(tokenizer_json: str, width: int, end_ids: list[int]) -> Any:
    """The `llguidance.LLTokenizer` of a served `tokenizer.json` (its text), for logits
    `width` wide, ending at `end_ids` (~0.2 s for a 32k vocabulary: build it once)."""
    import llguidance

    return llguidance.LLTokenizer(tokenizer_json, n_vocab=width, eos_token=list(end_ids))


def json_grammar(response_format: Any) -> str:
    """The llguidance grammar of an OpenAI `response_format` (`json_object` or
    `json_schema`), compact (no free whitespace between tokens).

    Raises:
        ValueError: naming what is wrong with the format or the schema.
    """
    import llguidance

    if not isinstance(response_format, dict):
        raise ValueError("`response_format` must be an object with a `type`")
    kind = response_format.get("type")
    if kind == "json_object":
        schema: Any = {"type": "object"}
    elif kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
            raise ValueError("`response_format.json_schema` must be an object with a `schema`")
        schema = spec.get("schema", {})
    else:
        raise ValueError(f"`response_format.type` must be 'text', 'json_object' or "
                         f"'json_schema'; received {str(kind)[:40]!r}")  # fmt: skip
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(
            schema, overrides={"whitespace_flexible": False}
        )
    except (ValueError, TypeError) as error:
        raise ValueError(f"the JSON schema is invalid: {error}"[:300]) from None
    problem = llguidance.LLMatcher.validate_grammar(grammar)
    if problem:
        raise ValueError(f"the JSON schema cannot be followed: {problem}"[:300])
    return grammar


def model_grammar_tokenizer(model: Any) -> Any:
    """The llguidance tokenizer of a served `TextModel`'s `tokenizer.json`, built once (under a
    lock: two first requests build it once) for constrained decoding; a `ValueError` for
    a tokenizer llguidance cannot read (our WordPiece settings file)."""
    predictor = model.predictor
    with predictor.grammar_lock:
        if predictor.grammar_tokenizer is None:
            native = getattr(model.words, "_tokenizer", None)
            if native is None:
                raise ValueError("JSON output needs a model served with a Hugging Face "
                                 "tokenizer.json")  # fmt: skip
            width = max(predictor.token_limit or 0, model.words.vocabulary_size)
            try:
                predictor.grammar_tokenizer = llguidance_tokenizer(
                    native.to_str(), width, predictor.end_token_ids
                )
            except Exception as error:  # llguidance's own message: the decoder it lacks
                raise ValueError(f"JSON output is not available for this tokenizer: "
                                 f"{str(error)[:200]}") from None  # fmt: skip
        return predictor.grammar_tokenizer
