"""Iteration-level batching of an encoder-decoder's generation (continuous batching over
`encode.onnx` and a `decode.onnx` that takes one position per row).

The requests that arrived since the last step are encoded together, shortest source first,
up to `PREFILL_ROWS` to a run (sources right-padded to the longest: the encoder masks the
padding, so each row's cross-attention keys and values are those of its source alone), and
each gets a row of the shared state:

- its self-attention cache `(layers, 2, max_length, kv_heads, key_dim)`, in which its own
  steps write its positions 0, 1, …;
- its cross-attention cache and its source ids, both padded to the widest source in flight
  (the decoder's source mask hides the padding, as it does for a batch decoded alone).

Every step then runs the decoder once for all rows, each its last id at its own position,
and each request chooses its next id from its own row: the id never generated is banned,
and the checkpoint's forced first and last ids (`sampling.force_ends`) apply at that
request's own step count, so a request's ids are those of decoding its source alone
(`Predictor.generate_ids`, and Keras `generate`). Beam search decodes each request alone.

Rows are kept packed (`shared_steps.SharedSteps`), a step runs on the smallest bucket of rows
(1, 2, 4, then multiples of 4) that holds them, and the state's source width follows the
widest source in flight: a step's cost follows the requests it advances.
"""

import numpy as np
from keras_attn_serving.decode_requests import _Request
from keras_attn_serving.generation import row_buckets
from keras_attn_serving.prefix_cache import PrefixCache
from keras_attn_serving.sampling import force_ends
from keras_attn_serving.seq2seq import EncoderDecoder
from keras_attn_serving.shared_steps import SharedSteps


class Seq2SeqBatcher(SharedSteps):
    """Continuous batching over one encoder-decoder's graphs. `stream(source ids, ...)`
    yields the new target ids of that source.

    Args:
        graphs: the artifact's `EncoderDecoder` (its `decode.onnx` must take a per-row
            `index`, and it must name a decoder start id).
        max_decode_rows: requests decoded together at most; more wait for a row.
    """

    prompt_is_target = False  # a prompt is a source; the target starts with the start id

    def __init__(self, graphs: EncoderDecoder, max_decode_rows: int = 32) -> None:
        if not graphs.per_row_index:
            raise ValueError("this decode.onnx takes one position for every row")
        super().__init__(max_decode_rows)
        self.graphs = graphs
        self.start_id = graphs.start_id  # a ValueError when the model names none
        self.max_length = graphs.max_length
        self.banned_id = graphs.never_generated_id
        self.vocabulary_size = graphs.vocabulary_size
        self.source_pad_id = int(graphs.spec["pad_token_id"])
        self.buckets = row_buckets(max_decode_rows)
        self.prefix = PrefixCache(0)  # prompts are sources: nothing to reuse (for metrics)
        spec = graphs.spec
        self._row_shape = (spec["layers"], 2, spec["max_length"], spec["kv_heads"],
                           spec["key_dim"])  # fmt: skip
        self.cache = np.zeros((0, *self._row_shape), np.float32)  # grown to a bucket on use
        self.cross = np.zeros((0, *self._row_shape[:2], 0, *self._row_shape[3:]), np.float32)
        self.sources = np.zeros((0, 0), np.int32)
        self._start()

    def _check_ids(self, prompt: list[int]) -> None:
        """A negative id would index the embedding from its end: refused. Ids past the
        encoder's vocabulary fail in the encoder, for their own request only."""
        if min(prompt) < 0:
            bad = sorted({t for t in prompt if t < 0})
            raise ValueError(f"`prompt` has negative ids: {bad[:5]}")

    def _reserve(self, rows: int, width: int) -> None:
        """Grows the state to hold `rows` rows (a bucket's worth) and sources `width` wide;
        a narrower width than held shrinks it to that (the widest source has left)."""
        capacity = max(len(self.cache), min(b for b in self.buckets if b >= rows))
        if capacity > len(self.cache):
            grown = np.zeros((capacity, *self._row_shape), np.float32)
            grown[: len(self.cache)] = self.cache
            self.cache = grown
        if capacity != len(self.cross) or width != self.sources.shape[1]:
            kept, held = len(self.sources), min(width, self.sources.shape[1])
            cross = np.zeros((capacity, *self._row_shape[:2], width, *self._row_shape[3:]),
                             np.float32)  # fmt: skip
            cross[:kept, :, :, :held] = self.cross[:, :, :, :held]
            sources = np.full((capacity, width), self.source_pad_id, np.int32)
            sources[:kept, :held] = self.sources[:, :held]
            self.cross, self.sources = cross, sources

    def _admit(self, requests: list[_Request]) -> None:
        """Encodes the sources of `requests` in one run and gives each a row; its first
        step is the next shared one (its decoder start id at position 0)."""
        width = max(len(r.prompt) for r in requests)
        padded = np.full((len(requests), width), self.source_pad_id, np.int32)
        for k, request in enumerate(requests):
            padded[k, : len(request.prompt)] = request.prompt
        (cross,) = self.graphs.encoder.run(None, {"encoder_token_ids": padded})
        held = max([len(r.prompt) for r in self.active], default=0)
        self._reserve(len(self.active) + len(requests), max(width, held))
        for k, request in enumerate(requests):
            row, length = len(self.active), len(request.prompt)
            self.cross[row] = 0.0
            self.cross[row, :, :, :length] = cross[k, :, :, :length]
            self.sources[row] = self.source_pad_id
            self.sources[row, :length] = request.prompt
            request.position, request.next_token = 0, self.start_id
            self.active.append(request)

    def _run_step(self, count: int) -> np.ndarray:
        widest = max(len(r.prompt) for r in self.active)
        if widest != self.sources.shape[1]:
            self._reserve(count, widest)
        rows = min(b for b in self.buckets if b >= count)
        token_ids = np.zeros((rows, 1), np.int32)
        index = np.zeros(rows, np.int32)
        for row, request in enumerate(self.active):
            token_ids[row, 0], index[row] = request.next_token, request.position
        for row in range(count, rows):  # a bucket's unused rows: their sources are padding
            self.sources[row] = self.source_pad_id
        logits, updated = self.graphs.run_decoder(
            token_ids, self.cache[:rows], index, self.cross[:rows], self.sources[:rows]
        )
        if rows == len(self.cache):
            self.cache = updated
        else:
            self.cache[:rows] = updated
        return logits

    def _forced(self, request: _Request, logits: np.ndarray) -> np.ndarray | None:
        eos, bos = self.graphs.forced_ids
        step = request.produced  # the index of the id being chosen among the new ones
        if not ((bos is not None and step == 0) or
                (eos is not None and step == request.max_new_tokens - 1)):  # fmt: skip
            return None
        return force_ends(self._banned(logits[None], np.float64), step, 1,
                          request.max_new_tokens, bos, eos)  # fmt: skip

    def _move_row(self, source: int, row: int, request: _Request) -> None:
        self.cache[row, :, :, : request.position] = self.cache[source, :, :, : request.position]
        self.cross[row] = self.cross[source]
        self.sources[row] = self.sources[source]
