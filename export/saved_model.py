"""TF SavedModel export of a functional Keras model, with dynamic batch and sequence axes."""

import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import keras
import tensorflow as tf

from keras_attn.preprocessing.preprocessor import FEATURES, TextPreprocessor

SIGNATURE = "serving_default"
TEXT_SIGNATURE = "serve_text"


def input_specs(model: keras.Model) -> list[dict]:
    """`[{"name", "dtype", "shape"}]` of a functional model's inputs, axes named."""
    specs = []
    for tensor in model.inputs:
        shape = ["batch"] + [
            ("sequence" if i == 0 else f"dim_{i}") if d is None else int(d)
            for i, d in enumerate(tensor.shape[1:])
        ]
        specs.append({"name": tensor.name, "dtype": tensor.dtype, "shape": shape})
    return specs


def output_names(model: keras.Model) -> list[str]:
    if isinstance(model.output, dict):
        return list(model.output)
    return list(model.output_names)


def call_model(model: keras.Model, by_name: dict) -> dict[str, Any]:
    """Runs `model` on inputs given by input name (whatever structure it was built with) and
    returns `{output name: tensor}`."""
    inputs = keras.tree.map_structure(lambda t: by_name[t.name], model.input)
    outputs = model(inputs, training=False)
    if isinstance(outputs, dict):
        return outputs
    outputs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
    return dict(zip(output_names(model), outputs, strict=True))


def output_specs(model: keras.Model) -> list[dict]:
    """`[{"name", "dtype", "shape"}]` of the outputs (always float32 once exported)."""
    specs = []
    outputs = model.output if isinstance(model.output, dict) else model.outputs
    tensors = outputs.values() if isinstance(outputs, dict) else outputs
    for name, tensor in zip(output_names(model), tensors, strict=True):
        shape = ["batch"] + [
            ("sequence" if i == 0 else f"dim_{i}") if d is None else int(d)
            for i, d in enumerate(tensor.shape[1:])
        ]
        specs.append({"name": name, "dtype": "float32", "shape": shape})
    return specs


def serving_function(model: keras.Model) -> tuple[Callable[..., Any], list[tf.TensorSpec]]:
    """A `tf.function` of named inputs to a dict of named float32 outputs."""
    specs = input_specs(model)
    signature = [
        tf.TensorSpec(
            [None] + [d if isinstance(d, int) else None for d in s["shape"][1:]],
            s["dtype"],
            name=s["name"],
        )
        for s in specs
    ]
    names = [s["name"] for s in specs]

    @tf.function(input_signature=signature)
    def serve(*inputs: tf.Tensor) -> dict[str, tf.Tensor]:
        outputs = call_model(model, dict(zip(names, inputs, strict=True)))
        return {n: tf.cast(o, tf.float32) for n, o in outputs.items()}

    return serve, signature


def text_serving_function(
    model: keras.Model, preprocessor: TextPreprocessor
) -> tuple[Callable[..., Any], list[tf.TensorSpec]]:
    """A `tf.function` of raw strings `(batch,)` to the model's named outputs: `preprocessor`
    (a `TextPreprocessor`) turns them into the model's inputs, which then take exactly the
    path of the ids-in signature."""
    serve, _ = serving_function(model)
    spec = [tf.TensorSpec([None], tf.string, name="text")]

    @tf.function(input_signature=spec)
    def serve_text(text: tf.Tensor) -> dict[str, tf.Tensor]:
        return serve(*text_feeds(model, preprocessor, text))

    return serve_text, spec


def text_feeds(model: keras.Model, preprocessor: TextPreprocessor, text: tf.Tensor) -> list:
    """The model's inputs for strings `text`, in `input_specs` order, each in its dtype."""
    features = preprocessor(text)
    specs = input_specs(model)
    if len(specs) == 1:
        return [tf.cast(features["token_ids"], specs[0]["dtype"])]
    unknown = [s["name"] for s in specs if s["name"] not in FEATURES]
    if unknown:
        raise ValueError(
            f"`serve_text` fills the inputs {list(FEATURES)}; the model also takes {unknown}"
        )
    return [tf.cast(features[s["name"]], s["dtype"]) for s in specs]


def write_saved_model(
    model: keras.Model,
    path: Path,
    assets: Iterable[str | Path] = (),
    preprocessor: TextPreprocessor | None = None,
) -> list[str]:
    """Writes `model` as a SavedModel; returns the signature names.

    `serving_default` takes the model's inputs (ids). With a `preprocessor`, `serve_text`
    takes raw strings and runs its tokenizer and packer in the graph; loading it needs
    `import tensorflow_text` first (its ops are tensorflow-text's). Files in `assets` (the
    tokenizer's vocabulary) are copied into `saved_model/assets/`.
    """
    serve, signature = serving_function(model)
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(name=SIGNATURE, fn=serve, input_signature=signature)
    names = [SIGNATURE]
    if preprocessor is not None:
        archive.track(preprocessor)
        serve_text, spec = text_serving_function(model, preprocessor)
        archive.add_endpoint(name=TEXT_SIGNATURE, fn=serve_text, input_signature=spec)
        names.append(TEXT_SIGNATURE)
    archive.write_out(str(path), verbose=False)
    # The graph embeds the tokenizer's model; the files are copied for readers of the folder.
    (path / "assets").mkdir(exist_ok=True)
    for asset in assets:
        shutil.copy2(asset, path / "assets" / Path(asset).name)
    return names


def load_signature(path: Path, name: str = SIGNATURE) -> tf.types.experimental.ConcreteFunction:
    import tensorflow_text  # noqa: F401  registers the ops a `serve_text` graph uses

    return tf.saved_model.load(str(path)).signatures[name]
