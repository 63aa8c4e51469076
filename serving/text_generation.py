"""How a `TextModel` answers `/generate`: the new ids of a prompt as `(id, text delta)`
pairs, in a thread or on the event loop, greedy, sampled or by beam search. A part of
`TextModel`, kept apart so that its file holds tokenizing and the other tasks."""

from collections.abc import AsyncGenerator, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from keras_attn_serving.detokenizer import Deltas

if TYPE_CHECKING:
    from keras_attn_serving.generation_request import GenerationRequest
    from keras_attn_serving.predictor import Predictor


class Generation:
    """`TextModel`'s generation methods (a mixin: it uses the model's predictor and
    tokenizer)."""

    predictor: "Predictor"

    def context(self, prompt: list[int]) -> list[int]:
        """The ids the new text follows: a decoder's prompt; none for an encoder-decoder
        (its prompt is the source, in the other stack)."""
        return [] if self.predictor.encoder_decoder is not None else prompt

    def stream(self, prompt: list[int], request: "GenerationRequest",
               outcome: dict[str, Any] | None = None) -> Iterator[tuple[int, str]]:  # fmt: skip
        """The continuation of prompt ids (greedy, or sampled as `request` says), yielded as
        `(token id, text delta)` pairs as tokens are chosen; the deltas join into the text
        the new ids add after the prompt's (`Detokenizer`), cut before the first of
        `request.stop_strings` (the token that completes it is the last one). With stop
        strings, text that could be the start of one is held back, and each pair is sent one
        token late (the last one carries the rest of the text)."""
        deltas = Deltas(self, self.context(prompt), request.stop_strings, request.reply)
        if request.beams is not None:  # the best hypothesis is known at the end: sent then
            tokens: Iterable[int] = self.predictor.beam_ids(
                prompt, request.max_tokens, request.stop_ids, request.beams
            )
        else:
            tokens = self.predictor.stream_ids(
                prompt, request.max_tokens, request.stop_ids, sampler=request.sampler
            )
        for token in tokens:
            yield from deltas.push(token)
            if deltas.stopped:
                if outcome is not None:
                    outcome["stop_string"] = True
                return
        yield from deltas.rest()

    def astream(
        self, prompt: list[int], request: "GenerationRequest", deadline: float | None = None,
        outcome: dict[str, Any] | None = None,
    ) -> AsyncGenerator[tuple[int, str], None] | None:  # fmt: skip
        """`stream` for a caller on an asyncio event loop, where the predictor shares decode
        steps between requests (no thread waits for the tokens); None where it decodes each
        prompt alone (run `stream` in a thread). Past `deadline` (a `time.perf_counter()`
        time) it raises `TimeoutError`."""
        if request.beams is not None:
            return None  # beam search runs in a thread of its own
        tokens = self.predictor.astream_ids(
            prompt, request.max_tokens, request.stop_ids, sampler=request.sampler,
            deadline=deadline, outcome=outcome,
        )  # fmt: skip
        return None if tokens is None else self._astream(prompt, request, tokens, outcome)

    async def _astream(self, prompt: list[int], request: "GenerationRequest",
                       tokens: AsyncGenerator[int, None], outcome: dict[str, Any] | None,
                       ) -> AsyncGenerator[tuple[int, str], None]:  # fmt: skip
        deltas = Deltas(self, self.context(prompt), request.stop_strings, request.reply)
        try:
            async for token in tokens:
                for pair in deltas.push(token):
                    yield pair
                if deltas.stopped:
                    if outcome is not None:
                        outcome["stop_string"] = True
                    return
            for pair in deltas.rest():
                yield pair
        finally:
            await tokens.aclose()
