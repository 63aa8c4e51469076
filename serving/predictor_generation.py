"""How a `Predictor` generates: greedy, sampled and beam decoding over the exported cache
graphs (`decode_gqa.onnx`, `decode.onnx`, or an encoder-decoder's `encode.onnx` +
`decode.onnx`), alone or in the shared decode loop. A part of `Predictor`, kept apart so that
its file holds loading and running the model."""

import threading
from collections.abc import AsyncGenerator, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, overload

import numpy as np
import onnxruntime as ort
from keras_attn_serving.batched_generation import DecodeBatcher
from keras_attn_serving.beam import beam_ids
from keras_attn_serving.generation import (
    BoundCache,
    PrefillTwin,
    decode_tokens,
    empty_cache,
    prefix_step,
)
from keras_attn_serving.seq2seq import EncoderDecoder
from keras_attn_serving.seq2seq_batching import Seq2SeqBatcher
from keras_attn_serving.shared_steps import SharedSteps

if TYPE_CHECKING:
    from keras_attn_serving.generation_request import Beams
    from keras_attn_serving.sampling import Sampler
    from numpy.typing import ArrayLike


class Generates:
    """`Predictor`'s generation methods (a mixin: it uses the predictor's sessions and
    manifest entries, set up by `Predictor.__init__`)."""

    folder: Path
    tokenizer: Any
    decoding: dict[str, Any] | None
    decode_session: ort.InferenceSession | None
    gqa: dict[str, Any]
    gqa_session: ort.InferenceSession | None
    prefill_twin: PrefillTwin | None
    pad_token_id: int | None
    encoder_decoder: EncoderDecoder | None
    max_sequence_length: int | None
    max_decode_rows: int
    prefix_cache_bytes: int
    _decode_step: Any
    _gqa_step: Any
    _decode_batcher: SharedSteps | None
    _closed: bool
    _batcher_lock: threading.Lock

    def logits(self, token_ids: "ArrayLike") -> np.ndarray:
        raise NotImplementedError

    def decode_step(self, token_ids: np.ndarray, cache: np.ndarray, index: int) -> list[np.ndarray]:
        """One call of the exported decode graph: `(last logits, updated cache)`."""
        return self._decode_step(token_ids, cache, index)

    def gqa_step(
        self, token_ids: np.ndarray, cache: BoundCache, index: int
    ) -> tuple[np.ndarray, BoundCache]:
        """One call of `decode_gqa.onnx` over a `BoundCache`: `(last logits, cache)`."""
        return self._gqa_step(token_ids, cache, index)

    def generate_ids(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int = 20,
        stop_token_ids: Iterable[int] = (),
        use_cache: bool | Literal["decode.onnx"] = True,
        sampler: "Sampler | None" = None,
    ) -> list[list[int]]:
        """Continuation of id prompts, greedy or drawn by `sampler` (a
        `keras_attn_serving.sampling.Sampler`: the same seed gives Keras `generate`'s ids);
        returns the new ids of each (a stop token ends a row and is not returned, as in
        `keras_attn.models.generate`). With `use_cache` (the default) it runs an exported
        key/value-cache graph: `decode_gqa.onnx` when the artifact has one, else
        `decode.onnx`; `use_cache="decode.onnx"` picks the latter; `False` reruns the full
        model over the prefix every step."""
        new: list[list[int]] = [[] for _ in prompts]
        for row, token in self.generate_tokens(
            prompts, max_new_tokens, stop_token_ids, use_cache, sampler
        ):
            new[row].append(token)
        return new

    def generate_tokens(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int = 20,
        stop_token_ids: Iterable[int] = (),
        use_cache: bool | Literal["decode.onnx"] = True,
        sampler: "Sampler | None" = None,
    ) -> Iterator[tuple[int, int]]:
        """`generate_ids` as a generator of `(row, new id)`, each as soon as it is chosen."""
        step, state, starts, banned, max_length = self._decoding(prompts, use_cache)
        graphs = self.encoder_decoder
        forced = (None, None) if graphs is None else graphs.forced_ids
        return decode_tokens(step, state, starts, max_new_tokens, stop_token_ids, banned,
                             max_length, sampler, *forced)  # fmt: skip

    def beam_ids(
        self,
        prompt: Sequence[int],
        max_new_tokens: int,
        stop_token_ids: Iterable[int],
        beams: "Beams",
    ) -> list[int]:
        """Beam search for one prompt (an encoder-decoder's: one source) over the exported
        cache graph, as Keras `generate(..., sampler="beam")` runs it; the new ids of the best
        hypothesis, without its stop id."""
        step: Any
        select: Any
        state: Any
        forced: tuple[int | None, int | None] = (None, None)
        if self.encoder_decoder is not None:
            graphs = self.encoder_decoder
            step, select, state = graphs.step, graphs.select, graphs.start([prompt])
            start, banned, limit = [graphs.start_id], graphs.never_generated_id, graphs.max_length
            forced = graphs.forced_ids
        elif self.gqa_session is not None:  # float or weight-only quantized
            step, state = self.gqa_step, BoundCache(self.gqa_session, self.gqa, 1,
                                                    self.prefill_twin)  # fmt: skip
            start, banned, limit = list(prompt), self.pad_token_id, self.gqa["max_length"]
            select = BeamCaches(self.gqa_session, self.gqa).select
        elif self.decode_session is not None and self.decoding is not None:
            step, state = self.decode_step, empty_cache(self.decoding, 1)
            start, banned, limit = list(prompt), self.pad_token_id, self.decoding["max_length"]
            select = _select_rows
        else:
            raise ValueError("beam search needs an exported cache graph (decode.onnx)")
        if len(start) + max_new_tokens > limit:
            raise ValueError(
                f"prompt length {len(start)} + max_new_tokens {max_new_tokens} exceeds the "
                f"model's maximum sequence length {limit}"
            )
        return beam_ids(step, select, state, start, max_new_tokens, beams.num_beams,
                        beams.length_penalty, set(stop_token_ids), banned,
                        beams.early_stopping, beams.no_repeat_ngram_size, *forced)  # fmt: skip

    def _decoding(self, prompts, use_cache):
        """`(step, state, prompts to continue, id never generated, max length)`: a decoder's
        prompts continue; an encoder-decoder's are sources, encoded here once, and each
        target starts from the decoder start id."""
        if self.encoder_decoder is not None:
            graphs = self.encoder_decoder
            starts = [[graphs.start_id] for _ in prompts]
            banned, limit = graphs.never_generated_id, graphs.max_length
            return graphs.step, graphs.start(prompts), starts, banned, limit
        step, state, max_length = self._decoder(len(prompts), use_cache)
        return step, state, [list(p) for p in prompts], self.pad_token_id, max_length

    def stream_ids(
        self,
        prompt: Sequence[int],
        max_new_tokens: int = 20,
        stop_token_ids: Iterable[int] = (),
        sampler: "Sampler | None" = None,
    ) -> Iterator[int]:
        """The new ids of one prompt, each as soon as it is chosen (what `/generate_stream`
        sends). With `max_decode_rows` and a decode graph that takes one position per row
        (`decode_gqa.onnx`, or an encoder-decoder's `decode.onnx`), concurrent calls share
        decode steps (`batched_generation`, `seq2seq_batching`); the ids are those of
        decoding the prompt alone either way. An encoder-decoder's prompt is its source."""
        batcher = self._batcher()
        if batcher is not None:
            return batcher.stream(prompt, max_new_tokens, stop_token_ids, sampler)
        tokens = self.generate_tokens([prompt], max_new_tokens, stop_token_ids, sampler=sampler)
        return (token for _, token in tokens)

    def astream_ids(
        self,
        prompt: Sequence[int],
        max_new_tokens: int = 20,
        stop_token_ids: Iterable[int] = (),
        sampler: "Sampler | None" = None,
        deadline: float | None = None,
        outcome: dict[str, Any] | None = None,
    ) -> AsyncGenerator[int, None] | None:
        """`stream_ids` for a caller on an asyncio event loop, where concurrent calls share
        decode steps (no thread waits for the ids); None where each prompt decodes alone
        (then run `stream_ids` in a thread). Past `deadline` (a `time.perf_counter()` time)
        the stream raises `TimeoutError`."""
        batcher = self._batcher()
        if batcher is None:
            return None
        return batcher.astream(prompt, max_new_tokens, stop_token_ids, sampler, deadline, outcome)

    @property
    def decode_batcher(self) -> "SharedSteps | None":
        """The shared decode loop, if one has started (for metrics)."""
        return self._decode_batcher

    def _batcher(self) -> "SharedSteps | None":
        """The shared decode loop, started on first use; None when it cannot run (graphs
        exported before one position per row, an encoder-decoder without a start id) or this
        predictor was closed (a request that loaded it before a reload decodes alone)."""
        if not self.max_decode_rows or self._closed:
            return None
        graphs = self.encoder_decoder
        if graphs is not None:
            if not graphs.per_row_index or graphs.spec["decoder_start_id"] is None:
                return None
        elif self.gqa_session is None or not per_row_index(self.gqa_session):
            return None
        with self._batcher_lock:
            if self._closed:
                return None
            if self._decode_batcher is None:
                self._decode_batcher = (
                    Seq2SeqBatcher(graphs, self.max_decode_rows) if graphs is not None
                    else DecodeBatcher(self.gqa_session, self.gqa, self.pad_token_id,
                                       self.max_decode_rows, self.prefix_cache_bytes,
                                       self.prefill_twin)
                )  # fmt: skip
            return self._decode_batcher

    def close(self) -> None:
        """Stops the shared decode loop, if one was started (requests in it get an error)."""
        with self._batcher_lock:
            batcher, self._decode_batcher = self._decode_batcher, None
            self._closed = True
        if batcher is not None:
            batcher.close()

    @property
    def decode_limit(self) -> int | None:
        """Positions one generation may fill, prompt and new ids together (an
        encoder-decoder's: its target): the cache graph's length, or the model's where it
        decodes over the whole prefix; None where neither is known."""
        if self.encoder_decoder is not None:
            return self.encoder_decoder.max_length
        if self.gqa_session is not None:
            return self.gqa["max_length"]
        if self.decode_session is not None and self.decoding is not None:
            return self.decoding["max_length"]
        return self.max_sequence_length

    def _decoder(self, batch, use_cache):
        """`(step, initial state, max length)` of greedy decoding: a decode graph over a
        key/value cache, or the full model over the whole prefix."""
        if use_cache not in (True, False, "decode.onnx"):
            raise ValueError(
                f"`use_cache` must be True, False or 'decode.onnx'. Received: {use_cache!r}"
            )
        if use_cache == "decode.onnx" and self.decode_session is None:
            raise ValueError("this artifact has no decode.onnx to decode with")
        if use_cache is True and self.gqa_session is not None:
            state = BoundCache(self.gqa_session, self.gqa, batch, self.prefill_twin)
            return self.gqa_step, state, self.gqa["max_length"]
        if use_cache and self.decode_session is not None:
            return self.decode_step, empty_cache(self.decoding, batch), self.decoding["max_length"]
        return prefix_step(self.logits), np.zeros((batch, 0), np.int32), self.max_sequence_length

    @overload
    def generate(self, prompts: str, max_new_tokens: int = 20) -> str: ...
    @overload
    def generate(self, prompts: list[str], max_new_tokens: int = 20) -> list[str]: ...
    def generate(self, prompts: str | list[str], max_new_tokens: int = 20) -> str | list[str]:
        """Greedy continuation of text prompts; returns prompt + continuation as text."""
        if self.tokenizer is None:
            raise ValueError("this artifact has no tokenizer/: use generate_ids()")
        if isinstance(prompts, str):
            return self.generate([prompts], max_new_tokens)[0]
        prompt_ids = self.tokenizer.encode(prompts)
        new = self.generate_ids(prompt_ids, max_new_tokens)
        return [self.tokenizer.decode(p + n) for p, n in zip(prompt_ids, new, strict=True)]


class BeamCaches:
    """Beam search's `select` over `decode_gqa.onnx`: the live beams' rows of a `BoundCache`
    gathered into another of as many rows (two per row count, used in turn, so no step
    allocates a cache), copying only the positions written so far."""

    def __init__(self, session: ort.InferenceSession, spec: dict[str, Any]) -> None:
        self.session, self.spec = session, spec
        self.caches: dict[int, list[BoundCache]] = {}

    def select(self, cache: BoundCache, rows: Sequence[int]) -> BoundCache:
        pair = self.caches.setdefault(len(rows), [])
        target = next((c for c in pair if c is not cache), None)
        if target is None:
            target = BoundCache(self.session, self.spec, len(rows))  # decode steps only
            pair.append(target)
        written = cache.written
        for mine, theirs in zip(target.arrays, cache.arrays, strict=True):
            mine[:, :, :written] = theirs[np.asarray(rows), :, :written]
        target.written = written
        return target


def _select_rows(cache: np.ndarray, rows: Sequence[int]) -> np.ndarray:
    return cache[np.asarray(rows)]


def per_row_index(session: ort.InferenceSession) -> bool:
    """Whether a `decode_gqa.onnx` takes one position per row (`index` of shape `(batch,)`),
    as iteration-level batching needs."""
    (index,) = [i for i in session.get_inputs() if i.name == "index"]
    return len(index.shape) == 1
