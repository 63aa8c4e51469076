"""What every keras_attn model shares: a functional graph, a config of constructor arguments,
and compile defaults (XLA on where it helps)."""

from typing import Any

import keras

from keras_attn.hardware import native_low_precision
from keras_attn.models.inputs import (
    check_id_arrays,
    check_label_array,
    check_not_empty,
    complete_inputs,
    preprocess_text,
    training_text,
)


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

    def quantize(self, mode: Any = None, config: Any = None, filters: Any = None,
                 **kwargs: Any) -> None:  # fmt: skip
        """Keras's `Model.quantize` (`"int8"`, `"float8"`, `"int4"`, with their configs),
        atomic and saved: every layer is checked before any is changed (an unknown mode, GPTQ
        or AWQ, an unbuilt layer or nothing left to quantize raise a `ValueError` and leave
        the model as it was; already quantized layers are skipped), and the config lists the
        quantized layers, so a `.keras` file reloads quantized."""
        from keras_attn.models import quantization

        quantization.quantize(self, super().quantize, mode, config, filters, **kwargs)

    def get_config(self) -> dict[str, Any]:
        config = {"name": self.name, "trainable": self.trainable}
        for arg in self.config_args:
            value = getattr(self, arg)
            if arg in self.nested_models:
                value = keras.saving.serialize_keras_object(value)
            config[arg] = value
        from keras_attn.models.quantization import quantized_layers

        nested = [getattr(self, arg) for arg in self.nested_models]
        quantized = quantized_layers(self, [m for m in nested if isinstance(m, ConfigModel)])
        if quantized:
            config["quantized_layers"] = quantized
        return config

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Any:
        config = dict(config)
        quantized = config.pop("quantized_layers", None)
        for arg in cls.nested_models:
            if config.get(arg) is not None:
                config[arg] = keras.saving.deserialize_keras_object(config[arg])
        model = cls(**config)
        if quantized:
            from keras_attn.models.quantization import requantize

            requantize(model, quantized)
        return model


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

    # Adam's rate for `optimizer="auto"` on a backbone loaded from a checkpoint: a fine-tuning
    # rate, as keras-hub's tasks use (1e-3 undoes what the checkpoint learned).
    fine_tuning_rate = 5e-5

    def compile(
        self,
        optimizer: Any = "auto",
        loss: Any = None,
        jit_compile: bool | str = "auto",
        **kwargs: Any,
    ) -> None:
        """`keras.Model.compile`, with `loss` defaulting to the model's `default_loss()` and
        `jit_compile="auto"` resolved by `resolve_jit_compile`. `optimizer="auto"` is Adam at
        `fine_tuning_rate` (5e-5; 2e-5 for a language model) when the backbone came from
        `from_pretrained`, else Adam at Keras's 1e-3."""
        if isinstance(optimizer, str) and optimizer == "auto":
            backbone = getattr(self, "backbone", self)
            pretrained = getattr(backbone, "from_checkpoint", False)
            optimizer = keras.optimizers.Adam(self.fine_tuning_rate) if pretrained else "adam"
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
        check_not_empty(x)
        x, y, kwargs = training_text(self, x, y, kwargs)
        x = preprocess_text(self, x)
        check_id_arrays(self, x, "x")
        check_label_array(self, y)
        return super().fit(x, y, *args, **kwargs)

    def evaluate(self, x: Any = None, y: Any = None, *args: Any, **kwargs: Any) -> Any:
        check_not_empty(x)
        x, y, kwargs = training_text(self, x, y, kwargs)
        x = preprocess_text(self, x)
        check_id_arrays(self, x, "x")
        check_label_array(self, y)
        return super().evaluate(x, y, *args, **kwargs)

    def predict(self, x: Any, *args: Any, **kwargs: Any) -> Any:
        check_not_empty(x)
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
