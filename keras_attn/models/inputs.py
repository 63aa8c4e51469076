"""What a task's `fit`, `evaluate`, `predict` and `__call__` accept: raw text through the task's
preprocessor, Hugging Face input names refused with ours, and NumPy ids and labels checked
before Keras traces a graph."""

from typing import Any

import keras
import numpy as np

# Hugging Face's input names, and ours.
HF_INPUT_NAMES = {"input_ids": "token_ids", "token_type_ids": "segment_ids",
                  "attention_mask": "padding_mask"}  # fmt: skip


def complete_inputs(model: keras.Model, inputs: dict[str, Any]) -> dict[str, Any]:
    """`inputs` for a model taking a dict: all-zero `segment_ids` filled in when only
    `token_ids` came (one segment, BERT's default); Hugging Face names refused with the
    names to use."""
    hf = sorted(set(inputs) & set(HF_INPUT_NAMES) - set(model.input))
    if hf:
        renames = ", ".join(f"{name} → {HF_INPUT_NAMES[name]}" for name in hf)
        hint = ""
        if "attention_mask" in hf and "padding_mask" not in model.input:
            hint = "; `padding_mask` needs a model built with `padding_mask_input=True`"
        raise ValueError(
            f"`inputs` uses Hugging Face names {hf}; this model takes {sorted(model.input)}. "
            f"Rename {renames}{hint}."
        )
    if "segment_ids" in model.input and "segment_ids" not in inputs and "token_ids" in inputs:
        ids = inputs["token_ids"]
        zeros = np.zeros_like(ids) if isinstance(ids, np.ndarray) else keras.ops.zeros_like(ids)
        inputs = {**inputs, "segment_ids": zeros}
    return inputs


def check_not_empty(x: Any, argument: str = "x") -> None:
    """`ValueError` for an empty batch: no text and no row (Keras fails deep inside)."""

    def is_empty(value: Any) -> bool:
        return (isinstance(value, list | tuple) and len(value) == 0) or (
            isinstance(value, np.ndarray) and value.size == 0
        )

    empty = is_empty(x) or (isinstance(x, dict) and any(map(is_empty, x.values())))
    if empty:
        raise ValueError(f"`{argument}` is empty: pass at least one text or one row of ids.")


def is_text(x: Any) -> bool:
    """Whether `x` is raw text: a string, a list or tuple of strings, a NumPy array of strings,
    or a string tensor."""
    if isinstance(x, str):
        return True
    if isinstance(x, (list, tuple)):
        return bool(x) and all(isinstance(item, str) for item in x)
    if isinstance(x, np.ndarray):
        return x.dtype.kind in "UO" and x.size > 0 and isinstance(x.flat[0], str)
    return getattr(x, "dtype", None) is not None and str(x.dtype) in ("string", "<dtype: 'string'>")


def training_text(
    model: keras.Model, x: Any, y: Any, kwargs: dict[str, Any]
) -> tuple[Any, Any, dict[str, Any]]:
    """`(x, y, kwargs)` for `fit`/`evaluate`: raw text without targets, given to a task whose
    preprocessor makes its own (`CausalLMPreprocessor`, `MaskedLMPreprocessor`:
    `training_batch`), becomes the inputs, targets and sample weights it makes (a dataset of
    strings is mapped). Anything else is returned as is."""
    batch = getattr(getattr(model, "preprocessor", None), "training_batch", None)
    if batch is None or y is not None:
        return x, y, kwargs
    from keras_attn.preprocessing.preprocessor import model_inputs

    if _text_dataset(x) and not isinstance(x.element_spec, tuple):  # strings, no targets

        def convert(text: Any) -> tuple[Any, Any, Any]:
            inputs, targets, weights = batch(text)
            return model_inputs(inputs, model.input), targets, weights

        return x.map(convert), None, kwargs
    if not is_text(x):
        return x, y, kwargs

    def arrays(text: Any) -> tuple[Any, np.ndarray, np.ndarray]:
        inputs, targets, weights = batch([text] if isinstance(text, str) else text)
        inputs = keras.tree.map_structure(np.asarray, model_inputs(inputs, model.input))
        return inputs, np.asarray(targets), np.asarray(weights)

    kwargs = {**kwargs}
    if is_text(kwargs.get("validation_data")):
        kwargs["validation_data"] = arrays(kwargs["validation_data"])
    inputs, targets, weights = arrays(x)
    if kwargs.get("sample_weight") is None:
        kwargs["sample_weight"] = weights
    return inputs, targets, kwargs


def preprocess_text(model: keras.Model, x: Any) -> Any:
    """`x` itself, unless it is raw text (or a `tf.data.Dataset` whose features are) and
    `model` has a preprocessor: then the model's inputs for that text (NumPy, or a mapped
    dataset). Raw text without a preprocessor is a `ValueError`."""
    dataset = _text_dataset(x)
    if not is_text(x) and not dataset:
        return x
    preprocessor = getattr(model, "preprocessor", None)
    if preprocessor is None:
        raise ValueError(
            f"`x` is raw text, and {type(model).__name__} has no preprocessor to tokenize it. "
            "Pass token ids, or build the task with `preprocessor=TextPreprocessor(tokenizer, "
            "packer)` (the `from_pretrained` of a folder with a vocabulary attaches one)."
        )
    from keras_attn.preprocessing.preprocessor import model_inputs

    if dataset:

        def convert(features: Any, *rest: Any) -> tuple[Any, ...]:
            return (model_inputs(preprocessor(features), model.input), *rest)

        return x.map(convert)
    text = [x] if isinstance(x, str) else x
    features = preprocessor(text)
    training_batch = getattr(preprocessor, "training_batch", None)
    if isinstance(model.input, dict) and set(model.input) - set(features) and training_batch:
        # Inputs only training makes (a masked LM's `mask_positions`, drawn anew each call,
        # as keras-hub's masked LMs do): take them from its batch.
        features = training_batch(text)[0]
    return keras.tree.map_structure(np.asarray, model_inputs(features, model.input))


def _text_dataset(x) -> bool:
    """Whether `x` is a `tf.data.Dataset` whose first component is strings."""
    spec = getattr(x, "element_spec", None)
    if spec is None or not type(x).__module__.startswith("tensorflow"):
        return False
    first = spec[0] if isinstance(spec, tuple) else spec
    return getattr(first, "dtype", None) is not None and first.dtype.name == "string"


def check_id_arrays(model: keras.Model, x: Any, argument: str) -> None:
    """`ValueError` naming the input when NumPy ids fall outside the largest token table, or a
    sequence is longer than the longest position table, of `model` (nested models included).
    Other inputs (tensors, datasets, floats) are left to Keras."""
    from keras_attn.layers import PositionEmbedding, TokenEmbedding

    if isinstance(x, np.ndarray) and len(model.inputs) == 1:
        x = {model.inputs[0].name: x}
    if not isinstance(x, dict):
        return
    layers = list(model._flatten_layers(include_self=False))
    vocabulary = max((t.vocabulary_size for t in layers if isinstance(t, TokenEmbedding)),
                     default=None)  # fmt: skip
    length = max((p.sequence_length for p in layers if isinstance(p, PositionEmbedding)),
                 default=None)  # fmt: skip
    for name, array in x.items():
        if isinstance(array, list | tuple):
            array = _rectangular(array)
        if isinstance(array, np.ndarray) and array.dtype.kind in "USO" and _int_input(model, name):
            raise ValueError(
                f"`{argument}[{name!r}]` must hold integer ids; received strings "
                f"({array.dtype}). Raw text goes in as a list of strings to a task with a "
                "preprocessor (`from_pretrained` gives one)."
            )
        if not isinstance(array, np.ndarray) or array.ndim != 2 or array.size == 0:
            continue
        if not np.issubdtype(array.dtype, np.integer):
            if np.issubdtype(array.dtype, np.floating) and _int_input(model, name):
                raise ValueError(
                    f"`{argument}[{name!r}]` must hold integer ids; floats would be cast "
                    f"(5.7 -> 5). Received dtype {array.dtype}"
                )
            continue
        if length is not None and array.shape[1] > length:
            raise ValueError(
                f"`{argument}[{name!r}]` has sequence length {array.shape[1]}; the model's "
                f"position table holds {length}. Received shape {array.shape}"
            )
        if vocabulary is not None and "segment" not in name:
            low, high = int(array.min()), int(array.max())
            if low < 0 or high >= vocabulary:
                raise ValueError(
                    f"`{argument}[{name!r}]` has ids outside [0, {vocabulary}): min {low}, "
                    f"max {high}"
                )


def _rectangular(values: list[Any] | tuple[Any, ...]) -> Any:
    """`values` as one NumPy array, or unchanged when they are ragged (several outputs'
    labels, rows of different lengths): Keras takes those as they are."""
    try:
        return np.asarray(values)
    except ValueError:
        return values


def _int_input(model, name) -> bool:
    inputs = model.input if isinstance(model.input, dict) else {model.inputs[0].name: None}
    tensor = inputs.get(name) if isinstance(model.input, dict) else model.inputs[0]
    return tensor is not None and "int" in str(tensor.dtype)


def check_label_array(model: keras.Model, y: Any) -> None:
    """`ValueError` when NumPy integer labels fall outside the classes of a model with one
    output `(..., classes)` (the head's `ignore_label`, or the loss's ignored id, excepted):
    Keras's sparse cross-entropy trains on them silently (label 5 of 2 classes: loss 0.46)."""
    if isinstance(y, list | tuple) and y:
        y = _rectangular(y)
    if isinstance(y, np.ndarray) and y.dtype.kind in "USO" and y.size:
        example = str(y.flat[0])
        raise ValueError(
            f"`y` holds strings (e.g. {example!r}); labels are class ids 0..n-1: "
            "`names, y = np.unique(labels, return_inverse=True)` makes them (export's "
            "`labels=` then names the classes)"
        )
    if not isinstance(y, np.ndarray) or y.size == 0 or not np.issubdtype(y.dtype, np.integer):
        return
    if isinstance(model.output, dict) or len(model.outputs) != 1:
        return
    classes = model.outputs[0].shape[-1]
    if classes is None:
        return
    ignored = {getattr(model, "ignore_label", None), getattr(model, "pad_token_id", None)}
    values = np.unique(y)
    bad = [int(v) for v in values if not 0 <= v < classes and int(v) not in ignored]
    if bad:
        raise ValueError(
            f"`y` holds labels outside the model's {classes} classes [0, {classes}): {bad[:5]}"
        )
