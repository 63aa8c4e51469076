"""`Predictor`: an exported artifact folder run in onnxruntime, with text in and out.

Imports neither TensorFlow nor Keras (a test checks), so a serving host needs only
onnxruntime, NumPy and `tokenizers`.
"""

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnxruntime as ort
from keras_attn_serving.chat_template import ChatTemplate
from keras_attn_serving.generation import (
    PrefillTwin,
    gqa_step,
    load_prefill_twin,
    session_step,
)
from keras_attn_serving.manifest import ArtifactError, read_manifest, verify_files
from keras_attn_serving.predictor_generation import Generates, per_row_index
from keras_attn_serving.seq2seq import EncoderDecoder
from keras_attn_serving.shared_steps import SharedSteps
from keras_attn_serving.tokenizer import load_text_tokenizer
from onnxruntime.capi import onnxruntime_pybind11_state as ort_errors

if TYPE_CHECKING:
    from numpy.typing import ArrayLike


class InputError(ValueError):
    """Inputs that do not fit the exported model: wrong names, shapes, dtypes, lengths, ids."""


class Predictor(Generates):
    """Runs an exported model (`model.onnx`, or only `decode_gqa.onnx` for an artifact exported
    with `formats=["generation"]`; `manifest.json` [+ `tokenizer/`]).

    Args:
        folder: the artifact folder `keras_attn_export.export_model` wrote.
        verify: check every file's sha256 against the manifest first. Defaults to `True`.
        num_threads: onnxruntime intra-op threads; defaults to onnxruntime's choice.
        max_decode_rows: `stream_ids` requests that share each decode step (iteration-level
            batching over `decode_gqa.onnx`, or an encoder-decoder's `decode.onnx`); 0 (the
            default) decodes each alone.
        decode_threads: onnxruntime intra-op threads of that decode graph when
            `max_decode_rows` shares its steps: one thread runs them all, so by default it
            gets onnxruntime's choice (every core), not `num_threads`.
        prefix_cache_bytes: prompt keys and values the shared decode loop keeps for prompts
            that begin alike (`prefix_cache.PrefixCache`); 0 (the default) keeps none. A
            decoder's only: an encoder-decoder's prompt is a source, with nothing to reuse.
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
        self._decode_batcher: SharedSteps | None = None
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
        manifest = self.manifest
        # An artifact exported with formats=["generation"] has its decode graph alone.
        self.session: ort.InferenceSession | None = None
        if not self.generation_only:
            self.session = ort.InferenceSession(
                str(self.folder / self._onnx_file()),
                options,
                providers=["CPUExecutionProvider"],
            )
        self.inputs = {spec.name: spec.model_dump() for spec in manifest.inputs}
        self.output_specs = [spec.model_dump() for spec in manifest.outputs]
        self.output_names = [spec["name"] for spec in self.output_specs]
        self.max_sequence_length = manifest.max_sequence_length
        self.decoding = manifest.decoding.model_dump() if manifest.decoding else None
        self.decode_session: ort.InferenceSession | None = None
        if self.decoding and self.decoding["file"]:
            self.decode_session = ort.InferenceSession(
                str(self.folder / self.decoding["file"]), options,
                providers=["CPUExecutionProvider"],
            )  # fmt: skip
            self._decode_step = session_step(self.decode_session)
        # `decode_gqa.onnx` (onnxruntime's GroupQueryAttention, cache updated in place) when
        # the export could write it: the graph generation uses.
        self.gqa = (self.decoding or {}).get("gqa") or {}
        # The id Keras `generate()` pads with and never generates (manifest
        # `decoding.pad_token_id`); None where id 0 is a token (GPT-2, Llama): every id can be
        # generated.
        self.pad_token_id: int | None = (self.decoding or {}).get("pad_token_id", 0)
        self.gqa_session: ort.InferenceSession | None = None
        self.prefill_twin: PrefillTwin | None = None
        shared = options
        if max_decode_rows:  # one decode thread runs every shared step: it gets the cores
            shared = ort.SessionOptions()
            if decode_threads:
                shared.intra_op_num_threads = decode_threads
        if self.gqa.get("file"):
            gqa_file = str(self.folder / self.gqa["file"])
            self.gqa_session = ort.InferenceSession(
                gqa_file, shared, providers=["CPUExecutionProvider"]
            )
            if shared is not options and not per_row_index(self.gqa_session):
                # Exported before decode graphs took one position per row: requests decode
                # alone, each in its thread, so this session keeps `num_threads`.
                self.gqa_session = ort.InferenceSession(
                    gqa_file, options, providers=["CPUExecutionProvider"]
                )
            self._gqa_step = gqa_step(self.gqa_session)
            # A quantized graph's twin at the accuracy level faster for prompts, if any.
            self.prefill_twin = load_prefill_twin(self.folder, self.gqa, shared, self.gqa_session)
        # An encoder-decoder's graphs: its prompts are sources, its decoding starts anew.
        self.encoder_decoder = (
            EncoderDecoder(
                self.folder, manifest.seq2seq.model_dump(), options,
                # all cores for the decode thread, where shared steps can run (a start id)
                shared if max_decode_rows and manifest.seq2seq.decoder_start_id is not None
                else None,
                manifest.input_ranges.get("encoder_token_ids"), manifest.max_sequence_length,
            )
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

    @property
    def generation_only(self) -> bool:
        """Whether the artifact holds a decode graph and no graph of every position's outputs
        (`export_model(..., formats=["generation"])`)."""
        decoding = self.manifest.decoding
        return self.manifest.onnx is None and bool(decoding and decoding.gqa and decoding.gqa.file)

    def _check_session(self) -> ort.InferenceSession:
        if self.session is None:
            raise InputError(
                "this model was exported for generation only (formats=['generation']: its "
                "decode graph, no graph of every position's outputs); it answers generate and "
                "completion requests, not inference on ids"
            )
        return self.session

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
        self._check_session()
        if set(feeds) != set(self.inputs):
            raise InputError(f"inputs must be {sorted(self.inputs)}; received {sorted(feeds)}")
        checked = {name: self._checked(name, value) for name, value in feeds.items()}
        rows = {name: a.shape[0] for name, a in checked.items()}
        if len(set(rows.values())) > 1:  # every input of a Keras model shares the batch axis
            raise InputError(f"inputs must have as many rows each; received {rows}"[:300])
        return checked

    def run_checked(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The model's outputs for inputs `check` accepted. Inputs of different sequence
        lengths are the model's to take or not: where onnxruntime cannot run them together,
        an `InputError` names the lengths (the export checked equal lengths only)."""
        session = self._check_session()
        try:
            outputs = session.run(self.output_names, arrays)
        except (ort_errors.Fail, ort_errors.InvalidArgument, ort_errors.RuntimeException):
            lengths = {n: a.shape[1] for n, a in arrays.items()
                       if a.ndim >= 2 and self.inputs[n]["shape"][1] == "sequence"}  # fmt: skip
            if len(set(lengths.values())) <= 1:
                raise
            raise InputError(f"the model cannot run inputs of sequence lengths {lengths} "
                             "together; give them one length"[:300]) from None  # fmt: skip
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
