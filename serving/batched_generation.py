"""Iteration-level batching of generation over `decode_gqa.onnx` (continuous batching).

One thread per model runs the decode steps. Each step takes one new token for every request in
flight, at its own position (`index` is `(batch,)`: GroupQueryAttention reads each row's own
length), so a request joins at the next step and leaves when it ends, instead of waiting for a
batch to form or finish. The requests that arrived since the last step are prefilled together,
in one run (up to `PREFILL_ROWS` at a time), and their keys and values copied into free rows
of the shared cache. Prompts of one length (a lone newcomer, say) are prefilled whole and the
run's logits give their first ids. Otherwise the run takes all of each prompt but its last id,
right-padded to the longest (a padded place is written past the prompt in the cache, and
overwritten by the request's own tokens before any step reads it), and each prompt's last id
goes through the next shared step, whose logits give the request's first new id.

Rows are kept packed (requests in rows `0 … n-1`; a request that ends is replaced by the last
one, whose cache rows are copied over), and a step runs on the smallest bucket of rows (1, 2,
4, then multiples of 4) that holds them: its cost follows the requests in flight, not the
capacity. Newcomers are prefilled shortest first, `PREFILL_ROWS` to a run, so that each run
pads its prompts to lengths close to theirs.

The loop itself (streams, deadlines, cancellation, each request's own sampler, failures kept
to the requests at fault) is `shared_steps.SharedSteps`, which the encoder-decoders' batcher
(`seq2seq_batching`) shares.
"""

from typing import TYPE_CHECKING, Any

import numpy as np
from keras_attn_serving.decode_requests import _fail, _Request
from keras_attn_serving.generation import BucketedCache, PrefillTwin
from keras_attn_serving.prefix_cache import PrefixCache
from keras_attn_serving.shared_steps import SharedSteps

if TYPE_CHECKING:
    import onnxruntime as ort


class DecodeBatcher(SharedSteps):
    """Continuous batching over one `decode_gqa.onnx` session.

    Args:
        session: the `decode_gqa.onnx` onnxruntime session (it must take a per-row `index`).
        spec: the manifest's `decoding.gqa` entry (`layers`, `kv_heads`, `key_dim`,
            `max_length`).
        pad_token_id: the id never generated (manifest `decoding.pad_token_id`); None: no id
            is banned.
        max_decode_rows: requests decoded together at most; more wait for a row.
        prefix_cache_bytes: the most bytes of prompt keys and values kept for prompts that
            begin the same way (`prefix_cache.PrefixCache`); 0 keeps none.
        prefill: the graph's prefill twin, which runs prefills of its `min_tokens` or more
            (`generation.PrefillTwin`), or None.
    """

    def __init__(self, session: "ort.InferenceSession", spec: dict[str, Any],
                 pad_token_id: int | None, max_decode_rows: int = 32,
                 prefix_cache_bytes: int = 0, prefill: PrefillTwin | None = None,
                 ) -> None:  # fmt: skip
        super().__init__(max_decode_rows)
        self.session, self.spec, self.pad_token_id = session, spec, pad_token_id
        self.banned_id = pad_token_id
        self.max_length = int(spec["max_length"])
        width = session.get_outputs()[0].shape[-1]  # the logits' width: ids the model embeds
        self.vocabulary_size = width if isinstance(width, int) else None
        self.cache = BucketedCache(session, spec, max_decode_rows)
        self.prefill = BucketedCache(session, spec, min(max_decode_rows, self.prefill_rows),
                                     prefill)  # fmt: skip
        self.prefix = PrefixCache(prefix_cache_bytes)
        self._start()

    def _admit_newcomers(self, live: list[_Request]) -> None:
        """Prompts that begin with cached blocks are admitted from them; the rest are
        prefilled, `prefill_rows` to a run."""
        super()._admit_newcomers([r for r in live if not self._admit_cached(r)])

    def _run(self, cache: BucketedCache, rows: int, token_ids: np.ndarray, index: np.ndarray
             ) -> np.ndarray:  # fmt: skip
        return cache.run(rows, token_ids, index)

    def _admit(self, requests: list[_Request]) -> None:
        """Prefills `requests` together and gives each a row of the shared cache. Prompts of
        one length are prefilled whole, and the run's logits give their first ids; else all
        of each prompt but its last id is, and the last id is its token in the next step."""
        whole = len({len(r.prompt) for r in requests}) == 1
        width = max(len(r.prompt) for r in requests) - (not whole)
        logits = None
        if width:
            rows = self.prefill.bucket(len(requests))
            token_ids = np.full((rows, width), self.pad_token_id or 0, np.int32)
            for k, request in enumerate(requests):
                ids = request.prompt if whole else request.prompt[:-1]
                token_ids[k, : len(ids)] = ids
            logits = self._run(self.prefill, rows, token_ids, np.zeros(rows, np.int32))
        greedy = None if logits is None or not whole else self._greedy(logits[: len(requests)])
        for k, request in enumerate(requests):
            request.position = len(request.prompt) - (not whole)
            request.next_token = request.prompt[-1]
            row = len(self.active)
            self.cache.copy_row(self.prefill, k, row, request.position)
            self.prefix.store(request.prompt, request.position, self.prefill.buffers, k)
            self.active.append(request)
            if whole:
                assert logits is not None and greedy is not None
                self._choose(row, request, logits[k], greedy[k])

    def _admit_cached(self, request: _Request) -> bool:
        """Admits `request` from the prefix cache when its prompt begins with held blocks:
        their keys and values are copied, and only the rest of the prompt is run (alone: a
        run that continues a cached prefix takes one row), or, when one id is left, it goes
        through the next shared step. False (nothing done) on a miss; a failure is the
        request's alone."""
        if not self.prefix.enabled:
            return False
        prompt = request.prompt
        found, blocks = self.prefix.lookup(prompt, len(prompt) - 1)
        if request.outcome is not None:
            request.outcome["cached_tokens"] = found
        if not found:
            return False
        try:
            suffix = prompt[found:]
            row = len(self.active)
            request.next_token = prompt[-1]
            # One id left: the blocks go straight into the request's row; else into the
            # prefill row the rest of the prompt runs on.
            target, at = (self.cache, row) if len(suffix) == 1 else (self.prefill, 0)
            for n, buffer in enumerate(target.buffers):
                buffer[at, :, :found] = np.concatenate([arrays[n] for arrays in blocks], 1)
            if len(suffix) == 1:
                request.position = found
                self.active.append(request)
                return True
            logits = self._run(self.prefill, 1, np.array([suffix], np.int32),
                               np.array([found], np.int32))  # fmt: skip
            request.position = len(prompt)
            self.cache.copy_row(self.prefill, 0, row, len(prompt))
            self.prefix.store(prompt, len(prompt), self.prefill.buffers, 0)
            self.active.append(request)
            self._choose(row, request, logits[0], self._greedy(logits[:1])[0])
        except Exception as error:
            _fail(request, error)  # first: the error reaches it before its end
            if request in self.active:
                self._finish(self.active.index(request))
        return True

    def _run_step(self, count: int) -> np.ndarray:
        rows = self.cache.bucket(count)
        token_ids = np.full((rows, 1), self.pad_token_id or 0, np.int32)
        index = np.zeros(rows, np.int32)
        for row, request in enumerate(self.active):
            token_ids[row, 0], index[row] = request.next_token, request.position
        return self._run(self.cache, rows, token_ids, index)

    def _move_row(self, source: int, row: int, request: _Request) -> None:
        self.cache.copy_row(self.cache, source, row, request.position)
