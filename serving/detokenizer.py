"""Generated ids to text, incrementally: each id is decoded once (with a few ids of context),
and a character still incomplete (a byte-level token that ends mid UTF-8 sequence decodes to
U+FFFD) is held back until the ids that complete it arrive, so every character is emitted
exactly once. Joined, the pieces are what the new ids add to the prompt's text, as
`transformers`' text-generation pipeline gives it (the decoding of prompt and new ids, less
the prompt's own decoding): the space before a first word stays, so prompt + text is the
whole text. A chat reply drops it (`reply=True`)."""

from collections.abc import Callable, Sequence
from typing import Any

REPLACEMENT = "\ufffd"
REPLY_SPACE = " \t\n\r"  # what a chat reply drops before its first word (Keras's too)
CONTEXT = 4  # ids decoded before each new one: word joins and spacing depend on them


def text_of(words: Any) -> Callable[[Sequence[int]], str]:
    """`words.decode` (special tokens dropped) that gives ids past the tokenizer no text: a
    model's padded vocabulary (Qwen2 has 151,936 rows for 151,665 tokens)."""
    size = words.vocabulary_size
    return lambda ids: words.decode([i for i in ids if 0 <= i < size])


class Detokenizer:
    """`push(id)` returns the text that id completes (`""` while a character is incomplete);
    `flush()` the text held when the ids end.

    Args:
        decode: ids -> text (special tokens dropped), the served tokenizer's `decode`.
        prompt: the prompt's ids; its last `CONTEXT` are the first context.
    """

    def __init__(self, decode: Callable[[Sequence[int]], str], prompt: Sequence[int]) -> None:
        self.decode = decode
        self.ids = [int(i) for i in prompt[-CONTEXT:]]
        self.before = decode(self.ids)  # the text of the context, already accounted for
        self.pending = False  # ids pushed whose text is not emitted yet

    def push(self, token: int) -> str:
        self.ids.append(int(token))
        self.pending = True
        after = self.decode(self.ids)
        if after.endswith(REPLACEMENT) or len(after) <= len(self.before):
            return ""
        return self._emit(after)

    def flush(self) -> str:
        return self._emit(self.decode(self.ids)) if self.pending else ""

    def _emit(self, after: str) -> str:
        piece = after[len(self.before) :]
        self.ids = self.ids[-CONTEXT:]
        self.before = self.decode(self.ids)
        self.pending = False
        return piece


class Deltas:
    """A generation's text, token by token: `push(id)` returns the `(id, text delta)` pairs
    ready to send, holding back text that could begin a stop string (each pair then goes one
    token late); `stopped` once the text holds a stop string (it is cut before it); `rest()`
    the last pair when the ids end. The text grows through one `Detokenizer`: each character
    is sent once, and the deltas join into the final text.

    Stop strings match the text sent, which leaves special tokens' text out (as vLLM
    matches them), and a special token whose own text is a stop string (`<|im_end|>`) stops
    where it comes. With `reply`, the spaces before the first word are dropped, whatever the
    stop strings."""

    def __init__(self, model: Any, prompt: list[int], stops: list[str], reply: bool = False
                 ) -> None:  # fmt: skip
        self.stops = stops
        self.reply = reply
        words = model.words
        self.special_text = lambda token: words.decode([token], skip_special=False)
        self.specials: frozenset[int] = (
            getattr(words, "special_ids", frozenset()) if stops else frozenset())  # fmt: skip
        self.words = Detokenizer(text_of(words), prompt)
        self.hold = max(map(len, stops), default=1) - 1
        self.shown, self.text = 0, ""  # characters of `text` sent so far
        self.held: tuple[int, str] | None = None  # the last pair, not sent yet
        self.stopped = False

    def _add(self, piece: str) -> int | None:
        """Appends `piece`; the index of the first stop string it completes, if any (only the
        tail that `piece` can reach is searched)."""
        if self.reply and not self.text:
            piece = piece.lstrip(REPLY_SPACE)
        start = max(0, len(self.text) - max(map(len, self.stops), default=0) + 1)
        self.text += piece
        found = (i for i in (self.text.find(stop, start) for stop in self.stops) if i >= 0)
        return min(found, default=None) if piece else None

    def push(self, token: int) -> list[tuple[int, str]]:
        cut = self._add(self.words.push(token))
        if cut is None and token in self.specials and self.special_text(token) in self.stops:
            cut = self._add(self.words.flush())  # the text held for the ids before it
            cut = len(self.text) if cut is None else cut
        ready = [] if self.held is None else [self.held]
        self.held = None
        if cut is not None:
            self.stopped = True
            return [*ready, (token, self.text[self.shown : max(cut, self.shown)])]
        safe = max(self.shown, len(self.text) - self.hold)
        pair = (token, self.text[self.shown : safe])
        self.shown = safe
        if self.hold or self.words.pending:  # the text still to come rides on the last pair
            self.held = pair
        else:
            ready.append(pair)
        return ready

    def rest(self) -> list[tuple[int, str]]:
        cut = self._add(self.words.flush())
        end = len(self.text) if cut is None else max(cut, self.shown)
        tail = self.text[self.shown : end]
        self.shown = end
        if self.held is None:  # nothing was held, so nothing is left: the text is all sent
            return []
        return [(self.held[0], self.held[1] + tail)]
