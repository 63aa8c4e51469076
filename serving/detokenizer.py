"""Generated ids to text, incrementally: each id is decoded once (with a few ids of context),
and a character still incomplete (a byte-level token that ends mid UTF-8 sequence decodes to
U+FFFD) is held back until the ids that complete it arrive, so every character is emitted
exactly once. Joined, the pieces equal the decoding of the prompt and the new ids, less the
prompt's own text, without leading spaces."""

from collections.abc import Callable, Sequence

REPLACEMENT = "\ufffd"
CONTEXT = 4  # ids decoded before each new one: word joins and spacing depend on them


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
        self.begun = False  # leading spaces of the continuation are dropped

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
        if not self.begun:
            piece = piece.lstrip()
            self.begun = bool(piece)
        return piece
