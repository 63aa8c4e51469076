"""TF SavedModel export of a functional Keras model, with dynamic batch and sequence axes."""

import shutil
from pathlib import Path

import keras
import tensorflow as tf

SIGNATURE = "serving_default"


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
    return list(model.output_names)


def output_specs(model: keras.Model) -> list[dict]:
    """`[{"name", "dtype", "shape"}]` of the outputs (always float32 once exported)."""
    specs = []
    for name, tensor in zip(output_names(model), model.outputs, strict=True):
        shape = ["batch"] + [
            ("sequence" if i == 0 else f"dim_{i}") if d is None else int(d)
            for i, d in enumerate(tensor.shape[1:])
        ]
        specs.append({"name": name, "dtype": "float32", "shape": shape})
    return specs


def serving_function(model: keras.Model):
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
    names = output_names(model)

    @tf.function(input_signature=signature)
    def serve(*inputs):
        outputs = model(list(inputs) if len(inputs) > 1 else inputs[0], training=False)
        outputs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
        return {n: tf.cast(o, tf.float32) for n, o in zip(names, outputs, strict=True)}

    return serve, signature


def write_saved_model(model: keras.Model, path: Path, assets: list[Path] = ()) -> None:
    """Writes `model` as a SavedModel with one signature, `serving_default`.

    Files in `assets` (e.g. the tokenizer's vocabulary) are copied into `saved_model/assets/`,
    where TF Serving and `tf.saved_model.load` users find them next to the graph.
    """
    serve, signature = serving_function(model)
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(name=SIGNATURE, fn=serve, input_signature=signature)
    archive.write_out(str(path), verbose=False)
    # ExportArchive keeps only resources its endpoints use, and the ids-in signature uses no
    # vocabulary, so the files are copied rather than tracked.
    (path / "assets").mkdir(exist_ok=True)
    for asset in assets:
        shutil.copy2(asset, path / "assets" / Path(asset).name)


def load_signature(path: Path):
    return tf.saved_model.load(str(path)).signatures[SIGNATURE]
