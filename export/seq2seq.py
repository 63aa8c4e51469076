"""Encoder-decoder generation exported: an encoder graph run once per request, and a decoder
step graph over the self-attention cache and the cross-attention cache the encoder made.

`encode.onnx` maps `encoder_token_ids (batch, S)` to `cross_cache (batch, layers, 2, S,
kv_heads, key_dim)`: every decoder block's cross-attention keys and values, projected once.
`decode.onnx` maps `token_ids (batch, new)`, `cache (batch, layers, 2, max_length, kv_heads,
key_dim)` (the decoder-only graphs' layout), `index (batch,)` (each row's position; `()`
before manifest format 5), `cross_cache` and
`encoder_token_ids` (for the source padding mask) to `logits (batch, vocab)` of the last new
token and `updated_cache`. Hugging Face's optimum splits these models the same way.
"""

from pathlib import Path
from typing import Any

import keras
import numpy as np
from keras_attn_export.parity import ParityError, max_abs_diff
from keras_attn_serving.generation import decode_ids
from keras_attn_serving.seq2seq import EncoderDecoder

from keras_attn.layers.tracing import onnx_tracing
from keras_attn.tokenizers import MarianTokenizer, UnigramTokenizer

# Cache length for decoders without a position table (T5's relative positions, Marian's
# sinusoids): transformers' default `max_length` for Marian.
DEFAULT_TARGET_LENGTH = 512


def is_seq2seq(model: keras.Model) -> bool:
    return hasattr(model, "encoder_side") and hasattr(model, "call_with_cache")


def cache_spec(lm: Any) -> dict[str, int]:
    """`{"layers", "kv_heads", "key_dim", "max_length"}` of the decoder's caches."""
    attention = lm.decoder_blocks[0].self_attention
    return {
        "layers": len(lm.decoder_blocks),
        "kv_heads": attention.num_key_value_heads or attention.num_heads,
        "key_dim": attention.key_dim,
        "max_length": int(lm.max_length or DEFAULT_TARGET_LENGTH),
    }


def _functions(
    lm: Any, spec: dict[str, int], per_row_index: bool = True
) -> tuple[Any, list, Any, list]:
    import tensorflow as tf

    layers, kv, width = spec["layers"], spec["kv_heads"], spec["key_dim"]
    source = tf.TensorSpec([None, None], tf.int32, name="encoder_token_ids")
    cross = tf.TensorSpec([None, layers, 2, None, kv, width], tf.float32, name="cross_cache")
    encode_signature = [source]
    decode_signature = [
        tf.TensorSpec([None, None], tf.int32, name="token_ids"),
        tf.TensorSpec([None, layers, 2, spec["max_length"], kv, width], tf.float32, name="cache"),
        # One position per row: rows at different lengths step together (format 5).
        tf.TensorSpec([None] if per_row_index else [], tf.int32, name="index"),
        cross,
        source,
    ]

    @tf.function(input_signature=encode_signature)
    def encode(encoder_token_ids: Any) -> dict[str, Any]:
        encoded = lm.encode(encoder_token_ids)
        caches = [block.cross_attention.key_value_cache(encoded) for block in lm.decoder_blocks]
        return {"cross_cache": tf.stack(caches, axis=1)}

    @tf.function(input_signature=decode_signature)
    def decode(
        token_ids: Any, cache: Any, index: Any, cross_cache: Any, encoder_token_ids: Any
    ) -> dict[str, Any]:
        state = {
            "caches": [cache[:, n] for n in range(layers)],
            "cross_caches": [cross_cache[:, n] for n in range(layers)],
            "source_mask": lm.encoder_side.padding(encoder_token_ids),
            "source_ids": encoder_token_ids,
        }
        with onnx_tracing():  # tf2onnx converts ScatterND, not XlaDynamicUpdateSlice
            logits, state = lm.call_with_cache(token_ids, state, index)
        return {"logits": logits[:, -1], "updated_cache": tf.stack(state["caches"], axis=1)}

    return encode, encode_signature, decode, decode_signature


def write_seq2seq_onnx(
    model: keras.Model, folder: Path, opset: int = 17, per_row_index: bool = True
) -> dict[str, int]:
    """Writes `encode.onnx` and `decode.onnx` of a `Seq2SeqLM`; returns the cache spec.
    `per_row_index=False` writes the decode graph as manifest formats before 5 did (one
    scalar `index`), which servers still run."""
    import tf2onnx

    spec = cache_spec(model)
    encode, encode_signature, decode, decode_signature = _functions(model, spec, per_row_index)
    for name, function, signature in (
        ("encode.onnx", encode, encode_signature),
        ("decode.onnx", decode, decode_signature),
    ):
        proto, _ = tf2onnx.convert.from_function(function, input_signature=signature, opset=opset)
        (folder / name).write_bytes(proto.SerializeToString())
    return spec


def check_seq2seq(model: keras.Model, folder: Path, spec: dict, tolerance: float) -> float:
    """Raises `ParityError` unless the graphs give the Keras model's logits at every target
    position (padded sources of three lengths; rows stepping at their own positions too)
    and Keras `generate()`'s greedy ids; returns
    the largest logits difference."""
    rng = np.random.default_rng(0)
    backbone = model.backbone
    pad, vocabulary = backbone.pad_token_id, backbone.vocabulary_size
    start = _start_id(backbone)
    lengths = (7, 3, 5)
    sources = np.full((3, max(lengths)), pad, "int32")
    for row, n in enumerate(lengths):
        sources[row, :n] = rng.choice([i for i in range(vocabulary) if i != pad], n)
    # Target ids the decoder may meet: not the padding id where it masks it (generation never
    # writes that id, and the cache holds no mask), from the target vocabulary.
    ids = range(backbone.decoder_token_embedding.vocabulary_size)
    allowed = [i for i in ids if not (backbone.mask_decoder_padding and i == pad)]
    targets = rng.choice(allowed, size=(3, min(6, spec["max_length"]))).astype("int32")
    targets[:, 0] = start
    full = keras.ops.convert_to_numpy(
        model({"encoder_token_ids": sources, "decoder_token_ids": targets}, training=False)
    )
    rows = [[int(t) for t in row if t != pad] for row in sources]
    graphs = EncoderDecoder(folder, {**spec, **_entry(model, spec), "decoder_start_id": start})
    state = graphs.start(rows)
    logits, state = graphs.step(targets[:, :2], state, 0)  # a prefill of two, then steps
    worst = max_abs_diff(logits, full[:, 1])
    for t in range(2, targets.shape[1]):
        logits, state = graphs.step(targets[:, t : t + 1], state, t)
        worst = max(worst, max_abs_diff(logits, full[:, t]))
    if graphs.per_row_index and targets.shape[1] >= 6:
        worst = max(worst, _rows_apart(graphs, rows, targets, full))
    if not worst <= tolerance:
        raise ParityError(f"decode.onnx logits differ from Keras by {worst:.3e} > {tolerance}")
    new = min(8, spec["max_length"] - 1)
    keras_ids = model.generate(rows, new, start)
    onnx_ids = decode_ids(graphs.step, graphs.start(rows), [[start]] * len(rows), new,
                          pad_token_id=graphs.never_generated_id,
                          max_length=spec["max_length"],
                          forced_eos_token_id=graphs.forced_eos_token_id,
                          forced_bos_token_id=graphs.forced_bos_token_id)  # fmt: skip
    if onnx_ids != keras_ids:
        raise ParityError(f"encoder-decoder greedy ids {onnx_ids} differ from Keras {keras_ids}")
    return worst


def _rows_apart(graphs: Any, rows: list, targets: np.ndarray, full: np.ndarray) -> float:
    """The largest logits difference when rows 2, 4 and 3 ids long step together, each at
    its own position (iteration-level batching): places past a row's length are prefilled
    with its start id, and its own steps overwrite them."""
    lengths = np.array([2, 4, 3])
    prefill = targets[:, :4].copy()
    for row, length in enumerate(lengths):
        prefill[row, length:] = targets[row, 0]
    _, state = graphs.step(prefill, graphs.start(rows), 0)
    worst = 0.0
    every = np.arange(len(lengths))
    for step in range(2):
        index = lengths + step
        logits, state = graphs.step(targets[every, index][:, None], state, index)
        worst = max(worst, max_abs_diff(logits, full[every, index]))
    return worst


def _start_id(backbone: Any) -> int:
    """The checkpoint's decoder start id, or (a model trained here without one) the first id
    that is not padding."""
    if backbone.decoder_start_token_id is not None:
        return int(backbone.decoder_start_token_id)
    return 1 if backbone.pad_token_id == 0 else 0


def _entry(model: keras.Model, spec: dict[str, int]) -> dict[str, Any]:
    """The manifest's `seq2seq` entry but for the check's figures."""
    backbone = model.backbone
    return {
        "encoder_file": "encode.onnx",
        "file": "decode.onnx",
        **spec,
        "pad_token_id": backbone.pad_token_id,
        # What Keras `generate` never generates: the padding id where the decoder masks it
        # or the checkpoint bans it (the other pretrained families may generate theirs).
        "never_generated_id": model.never_generated_id,
        # None: trained here without one; requests then name it (`decoder_start_id`).
        "decoder_start_id": backbone.decoder_start_token_id,
        "forced_eos_token_id": backbone.forced_eos_token_id,
        "forced_bos_token_id": backbone.forced_bos_token_id,
    }


def export_seq2seq(model: keras.Model, folder: Path, opset: int, tolerance: float) -> dict:
    """Both graphs, checked; the manifest's `seq2seq` entry."""
    spec = write_seq2seq_onnx(model, folder, opset)
    worst = check_seq2seq(model, folder, spec, tolerance)
    return {**_entry(model, spec), "opset": opset, "step_logits_max_abs_diff": worst,
            "greedy_equals_keras": True}  # fmt: skip


def export_seq2seq_text_onnx(
    model: keras.Model, folder: Path, tokenizer: Any, packer: Any, opset: int
) -> dict:
    """`encode.text.onnx`, checked: `text (1,)` → `token_ids (1, n)` (the packed source ids,
    `decode.onnx`'s `encoder_token_ids`) and `cross_cache`, the tokenizer written as an
    onnxruntime-extensions operator (`SentencepieceTokenizer` for T5 and Marian,
    `GPT2Tokenizer` for BART's byte-level BPE) in front of `encode.onnx`. On ASCII samples
    its ids equal the model's preprocessor's and its cache `encode.onnx`'s."""
    import onnx
    import onnxruntime as ort
    from keras_attn_export.compare import TEXT_SAMPLES
    from keras_attn_export.sentencepiece_onnx import sentencepiece_graph, sentencepiece_model
    from keras_attn_export.text_onnx import packed, text_outputs, tokenizer_onnx
    from onnx import compose

    encoder = onnx.load(folder / "encode.onnx")
    try:
        if isinstance(tokenizer, MarianTokenizer | UnigramTokenizer):
            data, id_map = sentencepiece_model(tokenizer)
            tokens = sentencepiece_graph(data, id_map, opset, encoder.ir_version)
        else:
            tokens = tokenizer_onnx(tokenizer, None, opset, encoder.ir_version)
    except ValueError as error:
        raise ValueError(
            "`strings_in` writes the tokenizer as an onnxruntime-extensions operator; it "
            f"cannot for this {type(tokenizer).__name__}: {error}"
        ) from None
    tokens = packed(tokens, packer.start_value, packer.end_value, packer.sequence_length)
    merged = compose.merge_models(tokens, encoder, io_map=[("token_ids", "encoder_token_ids")],
                                  outputs=["token_ids", "cross_cache"])  # fmt: skip
    onnx.save(merged, folder / "encode.text.onnx")
    ids_session = ort.InferenceSession(str(folder / "encode.onnx"),
                                       providers=["CPUExecutionProvider"])  # fmt: skip
    lines = [line for line in [*TEXT_SAMPLES, "translate English to German: The house is "
                               "wonderful.", "hello"] if line.isascii()]  # fmt: skip
    worst = 0.0
    for line, (got_ids, got_cache) in zip(lines, text_outputs(folder / "encode.text.onnx", lines),
                                          strict=True):  # fmt: skip
        row = np.asarray(packer(tokenizer([line])))[0]
        # Real places: up to the last non-padding id (a text may hold the padding token).
        real = np.flatnonzero(row != packer.pad_value)
        expected = row[: real[-1] + 1 if len(real) else 0].astype("int32")[None]
        if got_ids.tolist() != expected.tolist():
            raise ParityError(
                f"encode.text.onnx tokenizes {line!r} to {got_ids[0, :12].tolist()}…, the "
                f"model's preprocessor to {expected[0, :12].tolist()}…"
            )
        (cache,) = ids_session.run(None, {"encoder_token_ids": expected})
        worst = max(worst, max_abs_diff(got_cache, cache))
    if worst > 1e-5:
        raise ParityError(f"encode.text.onnx differs from encode.onnx on the same ids by {worst}")
    return {"file": "encode.text.onnx", "input": "text", "max_abs_diff": worst,
            "custom_ops": "onnxruntime_extensions"}  # fmt: skip
