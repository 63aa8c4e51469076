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

Rows are kept packed (`shared_steps.SharedSteps`), and the state is sized to the smallest
bucket of rows (1, 2, 4, then multiples of 4) that holds the requests in flight and to the
widest source among them, so memory and a step's cost follow the requests it advances, not
the capacity. A `decode.onnx` step reads and writes every row's whole self-attention cache
(`max_length` places): at 32 rows of a d=512, 4-layer BART at 128 places, 100 ms a step on 2
cores, three quarters of it slicing, stacking and transposing the cache (bench/README.md).
"""

import numpy as np
from keras_attn_serving.decode_requests import _Request
from keras_attn_serving.generation import bucket_of, row_buckets, zeroed
from keras_attn_serving.prefix_cache import PrefixCache
from keras_attn_serving.sampling import force_ends
from keras_attn_serving.seq2seq import ONE_POSITION, EncoderDecoder
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
            raise ValueError(ONE_POSITION)
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
        self.cache = np.zeros((0, *self._row_shape), np.float32)  # sized to a bucket on use
        self.cross = np.zeros((0, *self._row_shape[:2], 0, *self._row_shape[3:]), np.float32)
        self.sources = np.zeros((0, 0), np.int32)
        self._start()

    def _check_ids(self, prompt: list[int]) -> None:
        """Sources the encoder cannot take (too long, ids it has no embedding for) are
        refused before they join a shared encoder run."""
        self.graphs.check_source(prompt)

    def _reserve(self, rows: int, width: int) -> None:
        """Resizes the state to `rows` rows (the bucket a step runs on: each step's
        updated cache then replaces it whole, with no copy) and sources `width` wide (the
        widest in flight); the rows in flight keep theirs."""
        if rows == len(self.cache) and width == self.sources.shape[1]:
            return
        kept, held = min(rows, len(self.cache)), min(width, self.sources.shape[1])
        cache = zeroed((rows, *self._row_shape))
        cache[:kept] = self.cache[:kept]
        cross = np.zeros((rows, *self._row_shape[:2], width, *self._row_shape[3:]), np.float32)
        cross[:kept, :, :, :held] = self.cross[:kept, :, :, :held]
        sources = np.full((rows, width), self.source_pad_id, np.int32)
        sources[:kept, :held] = self.sources[:kept, :held]
        self.cache, self.cross, self.sources = cache, cross, sources

    def _admit(self, requests: list[_Request]) -> None:
        """Encodes the sources of `requests` in one run and gives each a row; its first
        step is the next shared one (its decoder start id at position 0)."""
        width = max(len(r.prompt) for r in requests)
        padded = np.full((len(requests), width), self.source_pad_id, np.int32)
        for k, request in enumerate(requests):
            padded[k, : len(request.prompt)] = request.prompt
        (cross,) = self.graphs.encoder.run(None, {"encoder_token_ids": padded})
        held = max([len(r.prompt) for r in self.active], default=0)
        self._reserve(bucket_of(self.buckets, len(self.active) + len(requests)), max(width, held))
        for k, request in enumerate(requests):
            row, length = len(self.active), len(request.prompt)
            self.cross[row] = 0.0
            self.cross[row, :, :, :length] = cross[k, :, :, :length]
            self.sources[row] = self.source_pad_id
            self.sources[row, :length] = request.prompt
            request.position, request.next_token = 0, self.start_id
            self.active.append(request)

    def _run_step(self, count: int) -> np.ndarray:
        rows = bucket_of(self.buckets, count)
        self._reserve(rows, max(len(r.prompt) for r in self.active))
        token_ids = np.zeros((rows, 1), np.int32)
        index = np.zeros(rows, np.int32)
        for row, request in enumerate(self.active):
            token_ids[row, 0], index[row] = request.next_token, request.position
        for row in range(count, rows):  # a bucket's unused rows: their sources are padding
            self.sources[row] = self.source_pad_id
        logits, updated = self.graphs.run_decoder(
            token_ids, self.cache, index, self.cross, self.sources
        )
        self.cache = updated
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
