"""What the manifest says about a model: versions, tasks, labels, packer, input ranges,
sequence and vocabulary limits (read from nested layers too), and the tokenizer assets."""

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import keras
import numpy as np
from keras_attn_export.parity import input_kind
from keras_attn_export.saved_model import input_specs
from keras_attn_serving.chat_template import TEMPLATE_FILE as CHAT_TEMPLATE_FILE

import keras_attn
import keras_attn.models as models
from keras_attn.models.cached import CachedCausalLM, cached_causal_lm
from keras_attn.preprocessing import SegmentPacker, StartEndPacker
from keras_attn.tokenizers import WordPieceTokenizer
from keras_attn.tokenizers.marian import MarianTokenizer
from keras_attn.tokenizers.pipeline import JsonTokenizer


def versions() -> dict:
    import onnx
    import onnxruntime
    import tensorflow as tf
    import tf2onnx

    return {
        "keras_attn": keras_attn.__version__,
        "keras": keras.__version__,
        "tensorflow": tf.__version__,
        "tf2onnx": tf2onnx.__version__,
        "onnx": onnx.__version__,
        "onnxruntime": onnxruntime.__version__,
    }


def nested_layers(model: keras.Model) -> Iterator[keras.layers.Layer]:
    """The model's layers, nested models' layers included (a head's encoder)."""
    for layer in model.layers:
        yield layer
        if isinstance(layer, keras.Model):
            yield from nested_layers(layer)


def layer_attribute(model: keras.Model, name: str) -> int | None:
    """Smallest integer `layer.<name>` over the model's layers (nested too), or None."""
    values: list[Any] = [getattr(layer, name, None) for layer in nested_layers(model)]
    values = [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
    return min(values) if values else None


def max_token_id(model: keras.Model) -> int:
    """Ids to sample in the parity check: below the smallest vocabulary in the model."""
    return layer_attribute(model, "vocabulary_size") or 2


def model_input_ranges(model: keras.Model) -> dict[str, list[int]]:
    """`{input name: [low, high)}` of the integer inputs whose values index a table (by the
    naming rule of `keras_attn_export.parity.input_kind`): token ids (the vocabulary), segment ids
    (`num_segments`), padding masks (0 or 1). The server refuses values outside them."""
    ranges: dict[str, list[int]] = {}
    bounds = {
        "token": layer_attribute(model, "vocabulary_size"),
        "segment": layer_attribute(model, "num_segments"),
        "mask": 2,
    }
    for spec in input_specs(model):
        kind = input_kind(spec["name"])
        if np.issubdtype(np.dtype(spec["dtype"]), np.integer) and bounds.get(kind):
            # not None: `bounds.get(kind)` is checked just above
            ranges[spec["name"]] = [0, bounds[kind]]  # type: ignore[list-item]
    return ranges


def max_sequence_length(model: keras.Model) -> int | None:
    """The longest input a learned position table allows (less an encoder's position offset,
    RoBERTa's 2), or None."""
    table = layer_attribute(model, "sequence_length")
    if table is None:
        return None
    return table - (layer_attribute(model, "position_offset") or 0)


# Model class -> the text endpoint that serves it (`keras_attn_serving.text`).
TASKS = {
    "CausalLM": "generate",
    "SequenceClassifier": "classify",
    "TokenClassifier": "tag",
    "Encoder": "embed",
    "SpanQA": "span_qa",
    "MultipleChoice": "multiple_choice",
    "EncoderPretrainer": "pretraining",
    "MaskedLM": "pretraining",
    "Seq2Seq": "seq2seq",
}


def task_of(model: keras.Model) -> str | None:
    """The manifest's `task`: what the model does, from its class (`None` for other models)."""
    for name, task in TASKS.items():
        if isinstance(model, getattr(models, name)):
            return task
    if isinstance(model, CachedCausalLM):  # a family of the user's, on the protocol
        return "generate"
    return None


def check_labels(model: keras.Model, labels: Sequence[str] | None, task: str | None) -> None:
    if labels is None:
        return
    if task not in ("classify", "tag"):
        raise ValueError(
            "`labels` names the classes of a model whose task is 'classify' or 'tag' (a "
            "SequenceClassifier, a TokenClassifier, or any model exported with that `task`). "
            f"Received labels for a {type(model).__name__} with task={task!r}"
        )
    classes = model.outputs[0].shape[-1]
    if not all(isinstance(x, str) for x in labels) or len(labels) != classes:
        raise ValueError(
            f"`labels` must be {classes} strings, one per class. Received: labels={labels!r}"
        )


def embedding_spec(model: keras.Model, task: str | None) -> dict[str, Any] | None:
    """The manifest's `embedding`: an embedding model's own pooling (an `Encoder`'s
    `embedding_pooling`, from its checkpoint), which `/embed` applies by default; or None."""
    pooling = getattr(model, "embedding_pooling", None)
    return dict(pooling) if task == "embed" and pooling else None


def packer_spec(packer: StartEndPacker | SegmentPacker | None) -> dict[str, Any] | None:
    """The manifest's `packer`: what the server adds around one text's ids, or `None`."""
    if packer is None:
        return None
    if not isinstance(packer, (StartEndPacker, SegmentPacker)):
        raise ValueError(
            "`packer` must be a StartEndPacker or a SegmentPacker. "
            f"Received: {type(packer).__name__}"
        )
    return {
        "type": "segment" if isinstance(packer, SegmentPacker) else "start_end",
        "sequence_length": packer.sequence_length,
        "start_value": packer.start_value,
        "end_value": packer.end_value,
        "pad_value": packer.pad_value,
        "truncate": packer.truncate if isinstance(packer, SegmentPacker) else None,
    }


def write_tokenizer(
    tokenizer: "WordPieceTokenizer | JsonTokenizer | MarianTokenizer", folder: Path
) -> list[Path]:
    """The server's `tokenizer/` folder: `tokenizer.json` (a Hugging Face one for
    `BytePairTokenizer`/`UnigramTokenizer`, our WordPiece or Marian settings otherwise) and
    `vocab.txt`; a Marian tokenizer adds `source.spm`, `target.spm` and `vocab.json`.
    Returns the files the SavedModel needs as assets (the WordPiece vocabulary)."""
    folder.mkdir()
    if isinstance(tokenizer, MarianTokenizer):  # its files, read by sentencepiece there
        tokenizer.save_assets(str(folder))
        settings = {"type": "marian", "special_tokens": list(tokenizer.special_tokens)}
        (folder / "tokenizer.json").write_text(json.dumps(settings, indent=2), encoding="utf-8")
        lines = [t.replace("\n", "\\n") for t in tokenizer.get_vocabulary()]
        (folder / "vocab.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
        return []
    if isinstance(tokenizer, JsonTokenizer):
        text = json.dumps(tokenizer.get_tokenizer_json(), ensure_ascii=False)
        (folder / "tokenizer.json").write_text(text, encoding="utf-8")
        # One token per line, for people reading the folder (the server reads the JSON).
        lines = [t.replace("\n", "\\n") for t in tokenizer.get_vocabulary()]
        (folder / "vocab.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
        return []
    vocab = folder / "vocab.txt"
    vocab.write_text("\n".join(tokenizer.get_vocabulary()) + "\n", encoding="utf-8")
    config = {
        "type": "wordpiece",
        "lowercase": tokenizer.lowercase,
        "strip_accents": tokenizer.lowercase,
        "special_tokens": list(tokenizer.special_tokens),
        "unknown_token": "[UNK]",
        "suffix_indicator": "##",
        "max_bytes_per_word": tokenizer.max_bytes_per_word,
        "pad_token_id": 0,
    }
    (folder / "tokenizer.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    return [vocab]


def write_chat(folder: Path, preprocessor: Any) -> dict[str, Any] | None:
    """The manifest's `chat` entry of a task whose preprocessor chats (a chat template or
    end-of-turn ids), its template written as `chat_template.jinja`; None otherwise."""
    template = getattr(preprocessor, "chat_template", None)
    end_ids = getattr(preprocessor, "end_token_ids", None)
    if template is None and not end_ids:
        return None
    if template is not None:
        (folder / CHAT_TEMPLATE_FILE).write_text(template, encoding="utf-8")
    return {
        "template": CHAT_TEMPLATE_FILE if template is not None else None,
        "special_tokens": getattr(preprocessor, "special_tokens", None) or {},
        "end_token_ids": list(end_ids or []),
    }


def model_max_length(model: keras.Model) -> int | None:
    """The longest sequence a causal LM's positions cover: its learned position table's
    length, else the `max_sequence_length` it was built with; None when nothing bounds it."""
    return cached_causal_lm(model).max_length or getattr(model, "max_sequence_length", None)


# The decode graphs' checks need a 5-token prompt and a few new tokens.
MIN_MAX_LENGTH = 8


def check_max_length(model: keras.Model, causal_lm: bool, max_length: int | None) -> None:
    """`ValueError` naming `max_length` unless it is None, or an integer from
    `MIN_MAX_LENGTH` to the model's own length, for a causal LM."""
    if max_length is None:
        return
    if not causal_lm:
        raise ValueError(
            "`max_length` sizes a causal LM's decode graphs; this model has none. Received: "
            f"max_length={max_length!r}"
        )
    limit = model_max_length(model)
    if (
        not isinstance(max_length, int | np.integer)
        or isinstance(max_length, bool)
        or not MIN_MAX_LENGTH <= max_length <= (limit or max_length)
    ):
        raise ValueError(
            f"`max_length` must be an integer from {MIN_MAX_LENGTH} to the model's "
            f"{limit} positions. Received: max_length={max_length!r}"
        )
