"""What every keras_attn model shares: a functional graph, a config of constructor arguments,
and compile defaults (XLA on where it helps)."""

from typing import Any

import keras
import numpy as np

from keras_attn.hardware import native_low_precision


def resolve_jit_compile(
    jit_compile: bool | str = "auto", dtype_policy: Any = None, flags: list[str] | None = None
) -> bool:
    """Our `"auto"`, decided by backend, device, dtype policy and what the CPU does natively
    (`bench/training.py` measures it on the machine it runs on):

    - PyTorch: off. JAX: on (XLA is how JAX runs).
    - TensorFlow under a `tf.distribute` strategy: off.
    - TensorFlow with a GPU: on.
    - TensorFlow on a CPU, float32: on (Keras's own `"auto"` is off on CPU-only machines;
      XLA made our steps 13-39% faster on one, and was a wash, +8% / -4% / -3%, on another).
    - TensorFlow on a CPU, bfloat16 or float16 compute: off where the CPU multiplies that
      dtype in hardware (`avx512_bf16`, AMX), whose fast kernels XLA's CPU backend does not
      use: bf16 ran 12,685 tokens/s without XLA and 6,363 with it on an AMX CPU, 6,662-7,006
      and 4,278-4,332 on an EPYC with `avx512_bf16`. On where it does not: an AVX2-only EPYC
      ran bf16 at 2,757 tokens/s with XLA and 2,081 without.

    Args:
        jit_compile: `"auto"`, or a bool returned as is.
        dtype_policy: the model's policy (name or `keras.DTypePolicy`); defaults to the
            global one.
        flags: CPU flags (`keras_attn.hardware.cpu_flags()` when None).
    """
    if jit_compile != "auto":
        return bool(jit_compile)
    backend = keras.backend.backend()
    if backend == "torch":
        return False
    if backend != "tensorflow":
        return True
    import tensorflow as tf

    if tf.distribute.has_strategy():
        return False
    if tf.config.list_logical_devices("GPU"):
        return True
    policy = keras.dtype_policies.get(dtype_policy or keras.config.dtype_policy())
    if policy.compute_dtype == "float16":
        return False  # unmeasured; XLA's CPU float16 is emulated
    if policy.compute_dtype == "bfloat16":
        return not native_low_precision("bfloat16", flags)
    return True


class ConfigModel(keras.Model):
    """A functional model rebuilt from its constructor arguments (base of backbones and tasks).

    Subclasses build a functional graph in `__init__`, call `super().__init__(inputs, outputs)`,
    and list their constructor arguments in `config_args`; nested models (a backbone under a
    task) are listed in `nested_models` and serialized with it. Loading a `.keras` file calls
    the constructor again, so shared and tied layers stay shared.
    """

    config_args: tuple[str, ...] = ()
    nested_models: tuple[str, ...] = ()

    def __init__(self, inputs: Any, outputs: Any, name: str | None = None, **kwargs: Any) -> None:
        # keras.Model accepts and drops any keyword: a misspelt or unsupported argument
        # (`CausalLM(..., num_key_value_heads=2)`) would silently build another model.
        unknown = sorted(set(kwargs) - {"trainable"})
        if unknown:
            raise ValueError(
                f"{type(self).__name__} got unexpected arguments {unknown}. Received: "
                + ", ".join(f"{key}={kwargs[key]!r}" for key in unknown)
            )
        super().__init__(inputs, outputs, name=name, **kwargs)

    def __call__(self, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(inputs, dict) and isinstance(self.input, dict):
            inputs = complete_inputs(self, inputs)
        return super().__call__(inputs, *args, **kwargs)

    def _set_config_args(self, values):
        """Keeps each constructor argument named in `config_args` (taken from the caller's
        `locals()`) as an attribute of the same name."""
        for arg in self.config_args:
            setattr(self, arg, values[arg])

    def get_config(self) -> dict[str, Any]:
        config = {"name": self.name, "trainable": self.trainable}
        for arg in self.config_args:
            value = getattr(self, arg)
            if arg in self.nested_models:
                value = keras.saving.serialize_keras_object(value)
            config[arg] = value
        return config

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Any:
        config = dict(config)
        for arg in cls.nested_models:
            if config.get(arg) is not None:
                config[arg] = keras.saving.deserialize_keras_object(config[arg])
        return cls(**config)


class Task(ConfigModel):
    """Base of keras_attn tasks: a backbone, the layers that turn its outputs into the task's
    (logits, spans, …), an optional `preprocessor` (raw strings to the model's inputs, saved
    with the task), and compile defaults: the task's loss, XLA where it helps."""

    def __init__(
        self,
        inputs: Any,
        outputs: Any,
        name: str | None = None,
        preprocessor: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(inputs, outputs, name=name, **kwargs)
        self.preprocessor = preprocessor

    @property
    def layers(self) -> list[keras.layers.Layer]:
        # The preprocessor is an attribute (saved with the task), not a layer of the graph.
        preprocessor = getattr(self, "preprocessor", None)
        return [layer for layer in super().layers if layer is not preprocessor]

    def compile(
        self,
        optimizer: Any = "adam",
        loss: Any = None,
        jit_compile: bool | str = "auto",
        **kwargs: Any,
    ) -> None:
        """`keras.Model.compile`, with `loss` defaulting to the model's `default_loss()` and
        `jit_compile="auto"` resolved by `resolve_jit_compile`."""
        super().compile(
            optimizer=optimizer,
            loss=self.default_loss() if loss is None else loss,
            jit_compile=resolve_jit_compile(jit_compile, self.dtype_policy),
            **kwargs,
        )

    # Raw strings go through the task's preprocessor (the one export serves with). NumPy
    # inputs are checked before Keras traces a graph: past the first trace the sequence axis
    # is unknown, and ids outside the table or a sequence past the position table would
    # surface as a TensorFlow op error (`GatherV2`, `Slice`) instead of a ValueError.
    def fit(self, x: Any = None, y: Any = None, *args: Any, **kwargs: Any) -> Any:
        x, y, kwargs = training_text(self, x, y, kwargs)
        x = preprocess_text(self, x)
        check_id_arrays(self, x, "x")
        check_label_array(self, y)
        return super().fit(x, y, *args, **kwargs)

    def evaluate(self, x: Any = None, y: Any = None, *args: Any, **kwargs: Any) -> Any:
        x, y, kwargs = training_text(self, x, y, kwargs)
        x = preprocess_text(self, x)
        check_id_arrays(self, x, "x")
        check_label_array(self, y)
        return super().evaluate(x, y, *args, **kwargs)

    def predict(self, x: Any, *args: Any, **kwargs: Any) -> Any:
        x = preprocess_text(self, x)
        check_id_arrays(self, x, "x")
        return super().predict(x, *args, **kwargs)

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        """Keras's TensorFlow trainer builds from the first distributed batch by averaging it
        across replicas (`strategy.reduce`), which fails under MultiWorkerMirroredStrategy
        ("unsupported type PerReplica"; keras-team/keras#20585). A worker's own first batch
        has the shapes the build needs: it is used instead, for every strategy."""
        if iterator is not None and getattr(self, "_distribute_strategy", None) is not None:
            import tensorflow as tf

            strategy = self._distribute_strategy
            for _, _, batches in iterator:
                data_batch = keras.tree.map_structure(
                    lambda value: (
                        strategy.experimental_local_results(value)[0]
                        if isinstance(value, tf.distribute.DistributedValues)
                        else value
                    ),
                    next(batches),
                )
                break
            iterator = None
        return super()._maybe_symbolic_build(iterator=iterator, data_batch=data_batch)

    # JAX's steps take `(state, data)` and return `(logs, state)`; TensorFlow's take `data`.
    def train_step(self, *args: Any, **kwargs: Any) -> Any:
        return _per_worker_logs(self, super().train_step(*args, **kwargs))

    def test_step(self, *args: Any, **kwargs: Any) -> Any:
        return _per_worker_logs(self, super().test_step(*args, **kwargs))

    def compile_from_config(self, config: dict[str, Any]) -> None:
        """Compiles a loaded model as it was saved. Keras skips this for a model whose
        `compile` is overridden (ours only fills defaults), which left a reloaded model with no
        optimizer and no loss; `load_model` then restores the optimizer's state."""
        self.compile(**keras.saving.deserialize_keras_object(config))
        if self.built:
            self.optimizer.build(self.trainable_variables)

    def default_loss(self) -> Any:
        raise NotImplementedError(f"{type(self).__name__} has no default loss; pass `loss`.")

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config["preprocessor"] = keras.saving.serialize_keras_object(self.preprocessor)
        return config

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Any:
        config = dict(config)
        if config.get("preprocessor") is not None:
            config["preprocessor"] = keras.saving.deserialize_keras_object(config["preprocessor"])
        return super().from_config(config)


def float32_logits(x: Any, name: str) -> Any:
    """Logits leave the model as float32 under mixed precision (stable softmax and loss)."""
    return keras.layers.Activation("linear", dtype="float32", name=name)(x)


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


def _int_input(model, name) -> bool:
    inputs = model.input if isinstance(model.input, dict) else {model.inputs[0].name: None}
    tensor = inputs.get(name) if isinstance(model.input, dict) else model.inputs[0]
    return tensor is not None and "int" in str(tensor.dtype)


def check_label_array(model: keras.Model, y: Any) -> None:
    """`ValueError` when NumPy integer labels fall outside the classes of a model with one
    output `(..., classes)` (the head's `ignore_label`, or the loss's ignored id, excepted):
    Keras's sparse cross-entropy trains on them silently (label 5 of 2 classes: loss 0.46)."""
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


def _per_worker_logs(model, logs):
    """Under MultiWorkerMirroredStrategy with more than one worker, Keras averages each step's
    logs over workers with `strategy.reduce("MEAN", value, axis=0)`, which fails on scalars
    ("Invalid reduction dimension 0", tensorflow#72388): they are given that axis."""
    if keras.backend.backend() != "tensorflow":
        return logs
    import tensorflow as tf

    strategy = tf.distribute.get_strategy()
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return logs
    if strategy.num_replicas_in_sync <= len(strategy.extended.worker_devices):
        return logs  # one worker: Keras's own path works
    return keras.tree.map_structure(lambda value: tf.reshape(value, [1]), logs)
