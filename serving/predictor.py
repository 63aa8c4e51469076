"""`Predictor`: an exported artifact folder run in onnxruntime, with text in and out.

Imports neither TensorFlow nor Keras (a test checks), so a serving host needs only
onnxruntime, NumPy and `tokenizers`.
"""

import threading
from collections.abc import AsyncGenerator, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, overload

import numpy as np
import onnxruntime as ort
from keras_attn_serving.batched_generation import DecodeBatcher
from keras_attn_serving.beam import beam_ids
from keras_attn_serving.chat_template import ChatTemplate
from keras_attn_serving.generation import (
    BoundCache,
    decode_ids,
    decode_tokens,
    empty_cache,
    gqa_step,
    prefix_step,
    session_step,
)
from keras_attn_serving.manifest import ArtifactError, read_manifest, verify_files
from keras_attn_serving.seq2seq import EncoderDecoder
from keras_attn_serving.tokenizer import load_text_tokenizer

if TYPE_CHECKING:
    from keras_attn_serving.generation_request import Beams
    from keras_attn_serving.sampling import Sampler
    from numpy.typing import ArrayLike


class InputError(ValueError):
    """Inputs that do not fit the exported model: wrong names, shapes, dtypes, lengths, ids."""


class Predictor:
    """Runs an exported model (`model.onnx` + `manifest.json` [+ `tokenizer/`]).

    Args:
        folder: the artifact folder `keras_attn_export.export_model` wrote.
        verify: check every file's sha256 against the manifest first. Defaults to `True`.
        num_threads: onnxruntime intra-op threads; defaults to onnxruntime's choice.
        max_decode_rows: `stream_ids` requests that share each decode step (iteration-level
            batching over `decode_gqa.onnx`); 0 (the default) decodes each alone.
        decode_threads: onnxruntime intra-op threads of `decode_gqa.onnx` when `max_decode_rows`
            shares its steps: one thread runs them all, so by default it gets onnxruntime's
            choice (every core), not `num_threads`.
        prefix_cache_bytes: prompt keys and values the shared decode loop keeps for prompts
            that begin alike (`prefix_cache.PrefixCache`); 0 (the default) keeps none.
    Example:
        >>> # Skipped in the doctest run: it needs an exported folder (make demo writes one).
        >>> p = Predictor("artifacts/shakespeare_lm")  # doctest: +SKIP
        >>> p.generate(["to be or not to be"], max_new_tokens=10)  # doctest: +SKIP
    """

    def __init__(
        self,
        folder: str | Path,
        verify: bool = True,
        num_threads: int | None = None,
        max_decode_rows: int = 0,
        decode_threads: int | None = None,
        prefix_cache_bytes: int = 0,
    ) -> None:
        rows = max_decode_rows
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
            raise ValueError(
                f"`max_decode_rows` must be a non-negative integer. Received: {max_decode_rows!r}"
            )
        self.folder = Path(folder)
        self.max_decode_rows = max_decode_rows
        self.prefix_cache_bytes = prefix_cache_bytes
        self._decode_batcher: DecodeBatcher | None = None
        self._closed = False
        self._batcher_lock = threading.Lock()
        self.manifest = read_manifest(self.folder)
        if verify:
            verify_files(self.folder, self.manifest)
        # The tokenizer first: a file it refuses costs no onnxruntime session.
        self.tokenizer = None
        if self.manifest.tokenizer:
            try:
                self.tokenizer = load_text_tokenizer(self.folder / self.manifest.tokenizer)
            except (ValueError, KeyError, OSError) as error:  # named: the file and the reason
                raise ArtifactError(f"{self.manifest.tokenizer}/: {str(error)[:300]}") from None
        options = ort.SessionOptions()
        # Sequential (the default, stated): no inter-op pool, so one intra-op thread computes
        # in the caller's thread alone, which the batcher's CPU-time clock relies on.
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        if num_threads:
            options.intra_op_num_threads = num_threads
        self.session = ort.InferenceSession(
            str(self.folder / self._onnx_file()),
            options,
            providers=["CPUExecutionProvider"],
        )
        manifest = self.manifest
        self.inputs = {spec.name: spec.model_dump() for spec in manifest.inputs}
        self.output_specs = [spec.model_dump() for spec in manifest.outputs]
        self.output_names = [spec["name"] for spec in self.output_specs]
        self.max_sequence_length = manifest.max_sequence_length
        self.decoding = manifest.decoding.model_dump() if manifest.decoding else None
        self.decode_session: ort.InferenceSession | None = None
        if self.decoding:
            self.decode_session = ort.InferenceSession(
                str(self.folder / self.decoding["file"]), options,
                providers=["CPUExecutionProvider"],
            )  # fmt: skip
            self._decode_step = session_step(self.decode_session)
        # `decode_gqa.onnx` (onnxruntime's GroupQueryAttention, cache updated in place) when
        # the export could write it: the graph generation uses.
        self.gqa = (self.decoding or {}).get("gqa") or {}
        # The id Keras `generate()` pads with and never generates (manifest `decoding.pad_id`);
        # None where id 0 is a token (GPT-2, Llama): every id can be generated.
        self.pad_id: int | None = (self.decoding or {}).get("pad_id", 0)
        self.gqa_session: ort.InferenceSession | None = None
        if self.gqa.get("file"):
            shared = options
            if max_decode_rows:  # one decode thread runs every step: it gets the cores
                shared = ort.SessionOptions()
                if decode_threads:
                    shared.intra_op_num_threads = decode_threads
            gqa_file = str(self.folder / self.gqa["file"])
            self.gqa_session = ort.InferenceSession(
                gqa_file, shared, providers=["CPUExecutionProvider"]
            )
            if shared is not options and not _per_row_index(self.gqa_session):
                # Exported before decode graphs took one position per row: requests decode
                # alone, each in its thread, so this session keeps `num_threads`.
                self.gqa_session = ort.InferenceSession(
                    gqa_file, options, providers=["CPUExecutionProvider"]
                )
            self._gqa_step = gqa_step(self.gqa_session)
        # An encoder-decoder's graphs: its prompts are sources, its decoding starts anew.
        self.encoder_decoder = (
            EncoderDecoder(self.folder, manifest.seq2seq.model_dump(), options)
            if manifest.seq2seq else None
        )  # fmt: skip
        # input name -> what `_checked` checks, worked out once
        self._plans = {name: self._plan(name) for name in self.inputs}
        self.chat_template, self.end_token_ids = self._chat()
        self.grammar_tokenizer: Any = None  # llguidance's, built on the first JSON request
        self.grammar_lock = threading.Lock()

    def _chat(self) -> tuple["ChatTemplate | None", list[int]]:
        """The artifact's chat template (compiled) and end-of-turn ids, checked against the
        model's vocabulary: a file that cannot serve is refused at load, named."""
        chat = self.manifest.chat
        if chat is None:
            return None, []
        sizes = (self.token_limit, self.tokenizer.vocabulary_size if self.tokenizer else None)
        limits = [x for x in sizes if x is not None]
        limit = min(limits) if limits else None
        bad = [i for i in chat.end_token_ids if limit is not None and not 0 <= i < limit]
        if bad:
            raise ArtifactError(f"manifest chat.end_token_ids {bad[:3]} are not ids of the model "
                                f"([0, {limit}))")  # fmt: skip
        if chat.template is None:
            return None, list(chat.end_token_ids)
        try:
            source = (self.folder / chat.template).read_text(encoding="utf-8")
            return ChatTemplate(source, chat.special_tokens), list(chat.end_token_ids)
        except (ValueError, OSError) as error:
            raise ArtifactError(f"{chat.template}: {str(error)[:300]}") from None

    def _onnx_file(self):
        if self.manifest.onnx is None:
            raise ArtifactError(f"{self.folder.name} has no ONNX graph to serve (SavedModel only)")
        return self.manifest.onnx.file

    def run(self, feeds: Mapping[str, "ArrayLike"]) -> dict[str, np.ndarray]:
        """Runs the model on `{input_name: array}`; returns `{output_name: array}`.

        Checks every input first and raises `InputError` naming the problem: input names,
        rank, fixed axes, dtype (integers are cast to the model's integer type only when no
        value changes, e.g. INT64 ids → INT32), sequence length, and ids outside the
        vocabulary.
        """
        return self.run_checked(self.check(feeds))

    def check(self, feeds: Mapping[str, "ArrayLike"]) -> dict[str, np.ndarray]:
        """`feeds` validated and cast to the model's dtypes, or `InputError` naming the problem."""
        if set(feeds) != set(self.inputs):
            raise InputError(f"inputs must be {sorted(self.inputs)}; received {sorted(feeds)}")
        return {name: self._checked(name, value) for name, value in feeds.items()}

    def run_checked(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The model's outputs for inputs `check` accepted."""
        outputs = self.session.run(self.output_names, arrays)
        return dict(zip(self.output_names, outputs, strict=True))

    def _checked(self, name, value):
        rank, fixed, want, integer, limit, low, high = self._plans[name]
        array = value if isinstance(value, np.ndarray) else np.asarray(value)
        if array.dtype == object:
            raise InputError(
                f"input {name!r} must be a rectangular numeric tensor of datatype "
                f"{self.inputs[name]['dtype'].upper()}; received strings or ragged rows "
                "(BYTES/object)"
            )
        if array.ndim != rank:
            raise InputError(
                f"input {name!r} must have rank {rank} {self.inputs[name]['shape']}; "
                f"received shape {list(array.shape)}"
            )
        if array.size == 0:  # onnxruntime fails on an empty batch or sequence
            raise InputError(f"input {name!r} has shape {list(array.shape)}: at least one row "
                             "and one position are needed")  # fmt: skip
        for axis, size in fixed:
            if array.shape[axis] != size:
                raise InputError(
                    f"input {name!r} axis {axis} must be {size}; received {array.shape[axis]}"
                )
        if array.dtype == want:
            cast = array
        else:
            if integer != np.issubdtype(array.dtype, np.integer):
                raise InputError(f"input {name!r} must be {want.name.upper()}; received "
                                 f"{array.dtype.name.upper()}")  # fmt: skip
            cast = array.astype(want)
            if integer and not np.array_equal(cast, array):
                raise InputError(f"input {name!r} has values outside {want}")
        if limit is not None and cast.ndim >= 2 and cast.shape[-1] > limit:
            raise InputError(f"input {name!r} has sequence length {cast.shape[-1]}; the model "
                             f"accepts at most {limit}")  # fmt: skip
        if high is not None and (cast.min() < low or cast.max() >= high):
            what = "ids" if "token" in name else "values"
            raise InputError(f"input {name!r} has {what} outside [{low}, {high})")
        return cast

    @property
    def token_limit(self) -> int | None:
        """Ids the model has embeddings for are `[0, token_limit)`: the range of its token
        input (the manifest's vocabulary), None when the manifest gives none."""
        for name, plan in self._plans.items():
            if "token" in name and plan[6] is not None:
                return int(plan[6])
        return None

    def _plan(self, name):
        """What `_checked` checks of input `name`: its rank, fixed axes, dtype, whether that
        is an integer type, the longest sequence and the value range."""
        spec = self.inputs[name]
        want = np.dtype(spec["dtype"])
        fixed = tuple((a, d) for a, d in enumerate(spec["shape"]) if isinstance(d, int))
        low, high = self.manifest.input_ranges.get(name) or (None, None)
        vocabulary = self.manifest.vocabulary_size
        if high is None and vocabulary and "token" in name:  # manifests before input_ranges
            low, high = 0, vocabulary
        return (len(spec["shape"]), fixed, want, np.issubdtype(want, np.integer),
                self.max_sequence_length, low, high)  # fmt: skip

    def logits(self, token_ids: "ArrayLike") -> np.ndarray:
        """Logits of a single-input language model for int ids `(batch, length)`."""
        (name,) = self.inputs
        return self.run({name: token_ids})[self.output_names[0]]

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
        step, state, starts, pad_id, max_length = self._decoding(prompts, use_cache)
        return decode_ids(step, state, starts, max_new_tokens, stop_token_ids, pad_id,
                          max_length, sampler)  # fmt: skip

    def generate_tokens(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int = 20,
        stop_token_ids: Iterable[int] = (),
        use_cache: bool | Literal["decode.onnx"] = True,
        sampler: "Sampler | None" = None,
    ) -> Iterator[tuple[int, int]]:
        """`generate_ids` as a generator of `(row, new id)`, each as soon as it is chosen."""
        step, state, starts, pad_id, max_length = self._decoding(prompts, use_cache)
        return decode_tokens(step, state, starts, max_new_tokens, stop_token_ids, pad_id,
                             max_length, sampler)  # fmt: skip

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
        if self.encoder_decoder is not None:
            graphs = self.encoder_decoder
            step, select, state = graphs.step, graphs.select, graphs.start([prompt])
            start, pad_id, limit = [graphs.start_id], graphs.pad_id, graphs.max_length
        elif self.decode_session is not None and self.decoding is not None:
            step, state = self.decode_step, empty_cache(self.decoding, 1)
            start, pad_id, limit = list(prompt), self.pad_id, self.decoding["max_length"]
            select = _select_rows
        else:
            raise ValueError("beam search needs an exported cache graph (decode.onnx)")
        if len(start) + max_new_tokens > limit:
            raise ValueError(
                f"prompt length {len(start)} + max_new_tokens {max_new_tokens} exceeds the "
                f"model's maximum sequence length {limit}"
            )
        return beam_ids(step, select, state, start, max_new_tokens, beams.num_beams,
                        beams.length_penalty, set(stop_token_ids), pad_id,
                        beams.early_stopping, beams.no_repeat_ngram_size)  # fmt: skip

    def _decoding(self, prompts, use_cache):
        """`(step, state, prompts to continue, id never generated, max length)`: a decoder's
        prompts continue; an encoder-decoder's are sources, encoded here once, and each
        target starts from the decoder start id."""
        if self.encoder_decoder is not None:
            graphs = self.encoder_decoder
            starts = [[graphs.start_id] for _ in prompts]
            return graphs.step, graphs.start(prompts), starts, graphs.pad_id, graphs.max_length
        step, state, max_length = self._decoder(len(prompts), use_cache)
        return step, state, [list(p) for p in prompts], self.pad_id, max_length

    def stream_ids(
        self,
        prompt: Sequence[int],
        max_new_tokens: int = 20,
        stop_token_ids: Iterable[int] = (),
        sampler: "Sampler | None" = None,
    ) -> Iterator[int]:
        """The new ids of one prompt, each as soon as it is chosen (what `/generate_stream`
        sends). With `max_decode_rows` and a `decode_gqa.onnx` that takes one position per row,
        concurrent calls share decode steps (`keras_attn_serving.batched_generation`); the
        ids are those of decoding the prompt alone either way."""
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
    def decode_batcher(self) -> "DecodeBatcher | None":
        """The shared decode loop, if one has started (for metrics)."""
        return self._decode_batcher

    def _batcher(self) -> "DecodeBatcher | None":
        """The shared decode loop, started on first use; None when it cannot run (or this
        predictor was closed: a request that loaded it before a reload decodes alone)."""
        if not self.max_decode_rows or self.gqa_session is None or self._closed:
            return None
        if not _per_row_index(self.gqa_session):  # exported before one position per row
            return None
        with self._batcher_lock:
            if self._closed:
                return None
            if self._decode_batcher is None:
                self._decode_batcher = DecodeBatcher(
                    self.gqa_session,
                    self.gqa,
                    self.pad_id,
                    self.max_decode_rows,
                    self.prefix_cache_bytes,
                )
            return self._decode_batcher

    def close(self) -> None:
        """Stops the shared decode loop, if one was started (requests in it get an error)."""
        with self._batcher_lock:
            batcher, self._decode_batcher = self._decode_batcher, None
            self._closed = True
        if batcher is not None:
            batcher.close()

    def _decoder(self, batch, use_cache):
        """`(step, initial state, max length)` of greedy decoding: a decode graph over a
        key/value cache, or the full model over the whole prefix."""
        if use_cache not in (True, False, "decode.onnx"):
            raise ValueError(
                f"`use_cache` must be True, False or 'decode.onnx'. Received: {use_cache!r}"
            )
        if use_cache is True and self.gqa_session is not None:
            state = BoundCache(self.gqa_session, self.gqa, batch)
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


def _select_rows(cache: np.ndarray, rows: Sequence[int]) -> np.ndarray:
    return cache[np.asarray(rows)]


def _per_row_index(session: ort.InferenceSession) -> bool:
    """Whether a `decode_gqa.onnx` takes one position per row (`index` of shape `(batch,)`),
    as iteration-level batching needs."""
    (index,) = [i for i in session.get_inputs() if i.name == "index"]
    return len(index.shape) == 1
