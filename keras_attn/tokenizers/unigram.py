"""Unigram language-model tokenization from a Hugging Face `tokenizer.json` (T5, ALBERT, XLNet,
and models trained with `tokenizers`' `UnigramTrainer`), run in the TensorFlow graph.

Each word is split by its most likely segmentation under the pieces' log-probabilities: the
Viterbi path, computed here as `tokenizers` computes it. Words of repeated characters have
many segmentations whose scores tie to the last bit, so the details decide the ids: float64
sums in `tokenizers`' order, the earliest-starting last piece among equal scores, and the
scores as `tokenizers` reads them from JSON (`json_plan.serde_float`: serde_json's fast
parser, at times one unit in the last place off the decimal). SentencePiece's own op (float32
sums) splits those words differently.
"""

from typing import Any

import keras
import tensorflow as tf

from keras_attn.tokenizers.json_plan import Plan
from keras_attn.tokenizers.pipeline import JsonTokenizer

UNKNOWN_PENALTY = 10.0  # an unknown character scores the lowest piece score minus this


def viterbi(
    words: tf.Tensor, scores: tf.lookup.StaticHashTable, longest: int, unknown_score: float
) -> tf.RaggedTensor:
    """`(n,)` words to ragged `(n, pieces)`: the best segmentation of each into pieces.

    `scores` maps a piece to its float64 score (NaN when absent); `longest` is the longest
    piece in characters. A character no piece of one character covers is its own piece,
    scored `unknown_score` (the caller maps it to the unknown id).
    """
    never = tf.constant(-float("inf"), tf.float64)
    chars = tf.strings.unicode_split(words, "UTF-8", errors="replace")
    # At least one column, so that the loops below run (and stack) once even with no words.
    width = tf.cast(tf.reduce_max(tf.concat([chars.row_lengths(), [1]], 0)), tf.int32)
    dense = chars.to_tensor("", shape=tf.stack([chars.nrows(), tf.cast(width, tf.int64)]))
    inside = tf.sequence_mask(chars.row_lengths(), width)
    # ending[:, e, k - 1]: score of the piece of k characters that ends at character e.
    ending, window = [], dense
    for k in range(1, longest + 1):
        if k > 1:
            window = window[:, :-1] + dense[:, k - 1 :]
        found = scores.lookup(window)
        valid = inside[:, k - 1 :] & ~tf.math.is_nan(found)
        score = tf.where(valid, found, never)
        if k == 1:  # an uncovered character: the unknown piece
            score = tf.where(inside & ~valid, tf.constant(unknown_score, tf.float64), score)
        ending.append(tf.pad(score, [[0, 0], [k, 0]], constant_values=never)[:, : width + 1])
    ending = tf.stack(ending, axis=-1)  # (n, width + 1, longest)
    count = tf.shape(words)[0]
    lengths_k = tf.range(1, longest + 1)

    def forward(e: tf.Tensor, recent: tf.Tensor, chosen: tf.TensorArray) -> tuple:
        # recent[:, k - 1]: best score of a path through the first e - k characters.
        candidates = recent + ending[:, e, :]
        best = tf.reduce_max(candidates, axis=1)
        # Ties: the piece that starts first (the longest), as `tokenizers` picks.
        k = tf.reduce_max(tf.where(candidates == best[:, None], lengths_k, 0), axis=1)
        recent = tf.concat([best[:, None], recent[:, :-1]], axis=1)
        return e + 1, recent, chosen.write(e - 1, k)

    start = tf.concat([tf.zeros([count, 1], tf.float64),
                       tf.fill([count, longest - 1], never)], axis=1)  # fmt: skip
    _, _, chosen = tf.while_loop(
        lambda e, recent, chosen: e <= width,
        forward,
        (tf.constant(1), start, tf.TensorArray(tf.int32, size=width, element_shape=[None])),
    )
    chosen = tf.transpose(tf.reshape(chosen.stack(), [width, count]))  # (n, width)

    def backward(
        step: tf.Tensor, end: tf.Tensor, starts: tf.TensorArray, lengths: tf.TensorArray
    ) -> tuple:
        k = tf.gather(chosen, tf.maximum(end - 1, 0), axis=1, batch_dims=1)
        k = tf.where(end > 0, k, 0)
        return step + 1, end - k, starts.write(step, end - k), lengths.write(step, k)

    _, _, starts, lengths = tf.while_loop(
        lambda step, end, starts, lengths: (step == 0) | tf.reduce_any(end > 0),
        backward,
        (tf.constant(0), tf.cast(chars.row_lengths(), tf.int32),
         tf.TensorArray(tf.int32, size=0, dynamic_size=True, element_shape=[None]),
         tf.TensorArray(tf.int32, size=0, dynamic_size=True, element_shape=[None])),
    )  # fmt: skip
    # Steps run from the last piece back: keep each word's pieces, then reverse each row.
    lengths = tf.RaggedTensor.from_tensor(
        tf.transpose(tf.reshape(lengths.stack(), [-1, count])), padding=0
    )
    starts = tf.RaggedTensor.from_tensor(
        tf.transpose(tf.reshape(starts.stack(), [-1, count])), lengths=lengths.row_lengths()
    )
    rows, splits = lengths.value_rowids(), lengths.row_splits
    backwards = (
        tf.gather(splits, rows)
        + tf.gather(splits, rows + 1)
        - 1
        - tf.range(tf.size(rows, out_type=tf.int64))
    )
    pieces = lengths.with_flat_values(tf.gather(lengths.flat_values, backwards))
    starts = starts.with_flat_values(tf.gather(starts.flat_values, backwards))
    return pieces.with_flat_values(
        tf.strings.substr(
            tf.gather(words, pieces.value_rowids()),
            starts.flat_values,
            pieces.flat_values,
            unit="UTF8_CHAR",
        )
    )


@keras.saving.register_keras_serializable(package="keras_attn")
class UnigramTokenizer(JsonTokenizer):
    """Strings to Unigram ids and back, in the TensorFlow graph, as `tokenizers` does.

    Build it with `UnigramTokenizer.from_tokenizer_json(path)` (or
    `keras_attn.tokenizers.from_tokenizer_json`, which picks the class). Ids equal the
    `tokenizers` library's on every line of a 10,000-line differential (tested).

    Args:
        sequence_length: optional int: dense `(batch, sequence_length)` output padded with 0.
    """

    MODEL = "Unigram"

    def _build_model(self, plan: Plan) -> None:
        pieces = [(t, s) for t, s in zip(plan.tokens, plan.scores, strict=False)
                  if t and t not in plan.added]  # fmt: skip
        self._scores = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(
                tf.constant([t for t, _ in pieces] or [""]),
                tf.constant([s for _, s in pieces] or [float("nan")], tf.float64),
            ),
            float("nan"),
        )
        self._longest = max([len(t) for t, _ in pieces] or [1])
        self._unknown_score = min([s for _, s in pieces] or [0.0]) - UNKNOWN_PENALTY
        byte_ids = [plan.vocabulary.get(f"<0x{b:02X}>", plan.unknown_id) for b in range(256)]
        self._byte_ids = tf.constant(byte_ids, tf.int32)

    def _encode_words(self, words):
        plan = self._plan
        pieces = viterbi(words, self._scores, self._longest, self._unknown_score)
        ids = tf.ragged.map_flat_values(self._ids.lookup, pieces)
        flat = ids.flat_values
        # Unknown pieces: one per run (`tokenizers` fuses them), as bytes with byte fallback.
        unknown = (flat < 0) | (flat == plan.unknown_id)
        index = tf.range(tf.size(flat, out_type=tf.int64))
        first = index == tf.gather(ids.row_splits, ids.value_rowids())
        run_start = unknown & ~(tf.concat([[False], unknown[:-1]], axis=0) & ~first)
        if plan.byte_fallback:
            return self._with_bytes(pieces, ids, unknown, run_start)
        keep = ~unknown | run_start
        ids = ids.with_flat_values(tf.where(unknown, plan.unknown_id, flat))  # type: ignore[arg-type]
        return tf.ragged.boolean_mask(ids, ids.with_flat_values(keep))

    def _with_bytes(self, pieces, ids, unknown, run_start):
        """Each run of unknown pieces as the `<0xNN>` ids of its UTF-8 bytes."""
        run = tf.cumsum(tf.cast(run_start, tf.int64)) - 1
        runs = tf.reduce_max(tf.concat([run, [-1]], 0)) + 1
        joined = tf.strings.unsorted_segment_join(
            tf.boolean_mask(pieces.flat_values, unknown), tf.boolean_mask(run, unknown), runs
        )
        text = tf.where(run_start, tf.gather(joined, tf.maximum(run, 0)), "")
        codes = tf.ragged.map_flat_values(
            lambda b: tf.cast(tf.io.decode_raw(b, tf.uint8)[:, 0], tf.int32),
            tf.strings.bytes_split(text),
        )
        as_bytes = tf.ragged.map_flat_values(lambda c: tf.gather(self._byte_ids, c), codes)
        single = tf.RaggedTensor.from_tensor(ids.flat_values[:, tf.newaxis])
        count = tf.size(unknown, out_type=tf.int64)
        index = tf.where(unknown, count + tf.range(count), tf.range(count))
        per_piece = tf.gather(tf.concat([single, as_bytes], axis=0), index)
        return tf.RaggedTensor.from_row_splits(per_piece, ids.row_splits).merge_dims(1, 2)

    def get_config(self) -> dict[str, Any]:
        # The pieces and scores travel as `tokenizer.json` in `.keras` archives.
        return {**super().get_config(), "special_tokens": None}
