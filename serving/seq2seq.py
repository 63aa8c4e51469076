"""Generation from an exported encoder-decoder (NumPy and onnxruntime only): the encoder graph
once per request, then decoder steps over the self-attention cache and the cross-attention
cache the encoder made (the manifest's `seq2seq` entry; see `keras_attn_export.seq2seq`)."""

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from keras_attn_serving.generation import zeroed
from keras_attn_serving.manifest import ArtifactError

ONE_POSITION = (
    "this decode.onnx takes one position for all rows (exported before manifest "
    "format 5): export it again for one position per row"
)
# The manifest's ids that index the decoder's logits.
TARGET_IDS = ("never_generated_id", "decoder_start_id", "forced_eos_token_id",
              "forced_bos_token_id")  # fmt: skip


class EncoderDecoder:
    """`encode.onnx` and `decode.onnx` of one artifact, as the `step` and start state of
    `keras_attn_serving.generation.decode_tokens`.

    Args:
        folder: the artifact folder.
        spec: the manifest's `seq2seq` entry (a dict).
        options: optional `onnxruntime.SessionOptions`.
        batched_options: the `decode.onnx` session's options where its steps are shared by
            the requests in flight (`seq2seq_batching`: one thread runs them, with every
            core); a graph that cannot share steps (a scalar `index`) keeps `options`.
        source_ids: `(low, high)`: the source ids the encoder embeds (the manifest's
            `input_ranges["encoder_token_ids"]`); None: unchecked.
        max_source_length: the longest source the encoder takes (its position table; the
            manifest's `max_sequence_length`); None: any.
    """

    def __init__(self, folder: Path, spec: dict[str, Any], options: Any = None,
                 batched_options: Any = None, source_ids: tuple[int, int] | None = None,
                 max_source_length: int | None = None) -> None:  # fmt: skip
        import onnxruntime as ort

        def session(name: str, chosen: Any = options) -> Any:
            return ort.InferenceSession(
                str(folder / name), chosen, providers=["CPUExecutionProvider"]
            )

        self.encoder = session(spec["encoder_file"])
        self.decoder = session(spec["file"], batched_options or options)
        self.spec = spec
        self.source_ids, self.max_source_length = source_ids, max_source_length
        self._start_id: int | None = spec["decoder_start_id"]
        # Never generated (None: every id may be).
        self.never_generated_id: int | None = spec["never_generated_id"]
        self.max_length: int = spec["max_length"]
        # The only id a generation's last step may choose (None: any id).
        self.forced_eos_token_id: int | None = spec.get("forced_eos_token_id")
        # The only id a generation's first step may choose (None: any id).
        self.forced_bos_token_id: int | None = spec.get("forced_bos_token_id")
        self._outputs = [o.name for o in self.decoder.get_outputs()]
        # Graphs written since iteration-level batching take one position per row
        # (`(batch,)`); older ones one scalar for every row. Both run.
        index = [i for i in self.decoder.get_inputs() if i.name == "index"]
        if len(index) != 1 or len(index[0].shape) > 1:
            raise ArtifactError(f"{spec['file']} has no `index` input of shape () or (batch,)")
        self.per_row_index = len(index[0].shape) == 1
        if batched_options is not None and not self.per_row_index:  # steps are never shared
            self.decoder = session(spec["file"])
        width = self.decoder.get_outputs()[self._outputs.index("logits")].shape[-1]
        # The logits' width: the ids the decoder can choose (None where the graph leaves it
        # open).
        self.vocabulary_size: int | None = width if isinstance(width, int) else None
        _check_ids(spec, width)

    @property
    def forced_ids(self) -> tuple[int | None, int | None]:
        """`(forced_eos_token_id, forced_bos_token_id)`, in the order `decode_tokens` and
        `beam_ids` take them."""
        return self.forced_eos_token_id, self.forced_bos_token_id

    @property
    def start_id(self) -> int:
        """The decoder's first input; a `ValueError` for a model that names none."""
        if self._start_id is None:
            raise ValueError(
                "this encoder-decoder names no decoder start id: export it with "
                "`decoder_start_token_id` set on its Seq2SeqBackbone"
            )
        return self._start_id

    def check_source(self, source: Sequence[int]) -> None:
        """A `ValueError` for a source the encoder cannot take: empty, too long, or with
        ids it has no embedding for (a negative id would index its table from the end)."""
        if len(source) == 0:
            raise ValueError("a source must have at least one id")
        limit = self.max_source_length
        if limit is not None and len(source) > limit:
            raise ValueError(
                f"a source of {len(source)} ids is longer than the encoder takes ({limit})"
            )
        low, high = self.source_ids or (0, None)
        if min(source) < low or (high is not None and max(source) >= high):
            bad = sorted({t for t in source if t < low or (high is not None and t >= high)})
            raise ValueError(f"the source has ids outside [{low}, {high}): {bad[:5]}")

    def start(self, sources: Sequence[Sequence[int]]) -> dict[str, np.ndarray]:
        """The decoding state of `sources` (id lists, checked and padded here): the
        encoder's cross-attention cache, computed once, and an empty self-attention
        cache."""
        for source in sources:
            self.check_source(source)
        width = max(len(s) for s in sources)
        padded = np.full((len(sources), width), self.spec["pad_token_id"], np.int32)
        for row, ids in enumerate(sources):
            padded[row, : len(ids)] = ids
        (cross,) = self.encoder.run(None, {"encoder_token_ids": padded})
        spec = self.spec
        shape = (len(sources), spec["layers"], 2, spec["max_length"], spec["kv_heads"],
                 spec["key_dim"])  # fmt: skip
        return {"cache": zeroed(shape), "cross_cache": cross, "sources": padded}

    @staticmethod
    def select(state: dict[str, np.ndarray], rows: Sequence[int]) -> dict[str, np.ndarray]:
        """The state of `rows`, in that order (beam search's surviving beams)."""
        return {key: value[np.asarray(rows)] for key, value in state.items()}

    def step(
        self, token_ids: np.ndarray, state: dict[str, np.ndarray], index: int | np.ndarray
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Logits of the last of `token_ids` placed at `index` (one int for every row, or one
        per row where the graph takes that: `per_row_index`), and the new state."""
        token_ids = np.asarray(token_ids, np.int32)
        index = np.asarray(index, np.int32)
        if self.per_row_index:  # (not `ascontiguousarray` for a scalar: it makes it 1-D)
            index = np.ascontiguousarray(np.broadcast_to(index, (len(token_ids),)))
        elif index.ndim:
            raise ValueError(ONE_POSITION)
        logits, cache = self.run_decoder(
            token_ids, state["cache"], index, state["cross_cache"], state["sources"]
        )
        return logits, {**state, "cache": cache}

    def run_decoder(self, token_ids: np.ndarray, cache: np.ndarray, index: np.ndarray,
                    cross_cache: np.ndarray, sources: np.ndarray,
                    ) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
        """One run of `decode.onnx` on its inputs: `(logits, updated self-attention cache)`."""
        feeds = {
            "token_ids": token_ids,
            "cache": cache,
            "index": index,
            "cross_cache": cross_cache,
            "encoder_token_ids": sources,
        }
        out = dict(zip(self._outputs, self.decoder.run(None, feeds), strict=True))
        return out["logits"], out["updated_cache"]


def _check_ids(spec: dict[str, Any], vocabulary: Any) -> None:
    """An `ArtifactError` unless each of the manifest's target ids indexes the logits."""
    for name in TARGET_IDS:
        value = spec.get(name)
        if value is None or not isinstance(vocabulary, int):
            continue
        if not 0 <= value < vocabulary:
            raise ArtifactError(
                f"manifest.json field 'seq2seq.{name}' is {value!r}: not an id of the decoder's "
                f"vocabulary [0, {vocabulary})"
            )
