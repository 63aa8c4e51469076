"""A user's functional model, exported like ours: its task, and its tokenizer taken out of the
graph.

The contract (README, "Your own functional model"):
- `task=` names what the outputs are: `classify` (one output `(batch, classes)`), `tag` (one
  output `(batch, sequence, classes)`), `embed` (`sequence_output`/`pooled_output` outputs, or
  one output `(batch, sequence, dim)` mean-pooled by the server, or `(batch, dim)` served as
  it is), `generate` (a causal LM following the contract of
  `keras_attn.models.cached.FunctionalCausalLM`: its
  decode graphs are exported with it). Our own classes need no `task=`: it comes from the
  class.
- A model whose one input is a string tensor feeding a `WordPieceTokenizer` (then optionally a
  `StartEndPacker` or `SegmentPacker`) is exported as its ids part, input `token_ids`, with
  that tokenizer and packer: the SavedModel's `serve_text` and the server tokenize raw text
  exactly as the model did.
"""

from typing import Any

import keras
import numpy as np

from keras_attn.models.cached import cached_causal_lm
from keras_attn.preprocessing import SegmentPacker, StartEndPacker
from keras_attn.tokenizers import WordPieceTokenizer

TASK_OUTPUT_RANKS = {"classify": (2,), "tag": (3,), "embed": (2, 3)}


def _outputs(model):
    """`{name: KerasTensor}` of a functional model's outputs."""
    if isinstance(model.output, dict):
        return dict(model.output)
    return dict(zip(model.output_names, model.outputs, strict=True))


def check_task(model: keras.Model, task: str | None, inferred: str | None) -> str | None:
    """The manifest's task: `task` if given (checked against the outputs), else `inferred`."""
    if task is None:
        return inferred
    known = (*TASK_OUTPUT_RANKS, "generate")
    if task not in known:
        raise ValueError(f"`task` must be one of {known}. Received: task={task!r}")
    if task == "generate":
        if inferred != "generate":
            cached_causal_lm(model)  # raises, naming the contract, if it cannot decode
        return task
    outputs = _outputs(model)
    if task == "embed" and "sequence_output" in outputs:
        return task
    ranks = TASK_OUTPUT_RANKS[task]
    if len(outputs) != 1 or len(next(iter(outputs.values())).shape) not in ranks:
        shapes = {name: tuple(t.shape) for name, t in outputs.items()}
        raise ValueError(
            f"`task={task!r}` needs one output of rank {' or '.join(map(str, ranks))}. "
            f"Received outputs {shapes}"
        )
    return task


def split_text_model(
    model: keras.Model,
) -> tuple[keras.Model, WordPieceTokenizer, StartEndPacker | SegmentPacker | None] | None:
    """`(ids_model, tokenizer, packer)` for a model taking strings through our tokenizer (and
    packer); `None` for a model taking ids.

    Raises:
        ValueError: a string input that does not go through exactly one `WordPieceTokenizer`
            into dense ids (give the tokenizer `sequence_length`, or follow it by a packer).
    """
    if len(model.inputs) != 1 or model.inputs[0].dtype != "string":
        return None

    tokenizers = [layer for layer in model.layers if isinstance(layer, WordPieceTokenizer)]
    packers = [
        layer for layer in model.layers if isinstance(layer, (StartEndPacker, SegmentPacker))
    ]
    if len(tokenizers) != 1 or len(packers) > 1:
        raise ValueError(
            "A model with a string input must tokenize it with one WordPieceTokenizer "
            f"(and at most one packer). Received: {len(tokenizers)} tokenizers, "
            f"{len(packers)} packers"
        )
    tokenizer, packer = tokenizers[0], (packers[0] if packers else None)
    ids = (packer or tokenizer).output
    if isinstance(ids, (list, tuple, dict)):
        ids = ids["token_ids"] if isinstance(ids, dict) else ids[0]
    if getattr(ids, "ragged", False) or len(ids.shape) != 2:
        raise ValueError(
            "The tokenizer's ids must be dense (batch, sequence): give the tokenizer "
            "`sequence_length` or follow it by a StartEndPacker."
        )
    body = keras.Model(ids, _outputs(model), name=f"{model.name}_ids")
    token_ids = keras.Input(ids.shape[1:], dtype="int32", name="token_ids")
    return keras.Model(token_ids, body(token_ids), name=model.name), tokenizer, packer


def as_float32(model: keras.Model) -> keras.Model:
    """`model` itself when it computes in float32, else a float32 copy with its weights:
    exported graphs are float32 whatever policy the model trained under."""
    layers = list(model._flatten_layers(include_self=True))
    if all(layer.compute_dtype not in ("float16", "bfloat16") for layer in layers):
        return model

    def float32_policies(value: Any) -> Any:
        if isinstance(value, dict):
            if value.get("class_name") in ("DTypePolicy", "DTypePolicyMap"):
                return "float32"
            return {k: float32_policies(v) for k, v in value.items()}
        if isinstance(value, list):
            return [float32_policies(v) for v in value]
        if isinstance(value, str) and value.startswith("mixed_"):
            return "float32"
        return value

    config = float32_policies(keras.saving.serialize_keras_object(model))
    copy = keras.saving.deserialize_keras_object(config)
    copy.set_weights([np.asarray(w, dtype="float32") for w in model.get_weights()])
    return copy
