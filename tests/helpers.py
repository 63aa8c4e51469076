"""One table of example constructions, one per public layer, shared by the generic tests."""

import dataclasses
import threading

import keras
import numpy as np

import keras_attn as ka

RNG = np.random.default_rng(0)


def floats(*shape):
    return RNG.standard_normal(shape).astype("float32")


def ids(*shape, high=50):
    out = RNG.integers(1, high, size=shape).astype("int32")
    out[0, -2:] = 0  # padding at the end of the first row
    return out


@dataclasses.dataclass
class Case:
    cls: type
    init_kwargs: dict
    inputs: list
    call_kwargs: dict = dataclasses.field(default_factory=dict)

    @property
    def name(self):
        return self.cls.__name__

    def make(self, **overrides):
        return self.cls(**{**self.init_kwargs, **overrides})

    def model(self, layer=None):
        """A functional model around the layer: one `keras.Input` per input array."""
        layer = layer or self.make()
        inputs = [
            keras.Input(shape=x.shape[1:], dtype=str(x.dtype), name=f"in{i}")
            for i, x in enumerate(self.inputs)
        ]
        return keras.Model(inputs, layer(*inputs, **self.call_kwargs))


CASES = [
    Case(ka.DotScore, {}, [floats(2, 3, 4), floats(2, 5, 4)]),
    Case(ka.ScaledDotScore, {"scale": 0.3}, [floats(2, 3, 4), floats(2, 5, 4)]),
    Case(ka.BilinearScore, {"kernel_initializer": "he_normal"}, [floats(2, 3, 4), floats(2, 5, 6)]),
    Case(
        ka.AdditiveScore,
        {"units": 6, "use_bias": False, "kernel_initializer": "he_normal"},
        [floats(2, 3, 4), floats(2, 5, 6)],
    ),
    Case(
        ka.Attention,
        {
            "score": "additive",
            "key_dim": 8,
            "value_dim": 6,
            "use_bias": False,
            "dropout": 0.1,
            "kernel_initializer": "he_normal",
            "bias_initializer": "ones",
        },
        [floats(2, 3, 4), floats(2, 5, 6)],
    ),
    Case(
        ka.MultiHeadAttention,
        {
            "num_heads": 4,
            "key_dim": 4,
            "value_dim": 6,
            "num_key_value_heads": 2,
            "dropout": 0.1,
            "use_bias": False,
            "output_dim": 12,
            "score": "bilinear",
            "kernel_initializer": "he_normal",
            "bias_initializer": "ones",
            "output_use_bias": True,
            "rope_max_wavelength": 500.0,
            "rope_scaling": {"rope_type": "linear", "factor": 2.0},
        },
        [floats(2, 5, 16)],
        {"use_causal_mask": True},
    ),
    Case(
        ka.TokenEmbedding,
        {
            "vocabulary_size": 50,
            "embedding_dim": 8,
            "mask_zero": True,
            "embeddings_initializer": "he_normal",
            "tie_weights": False,
            "reverse_bias": True,
        },
        [ids(2, 5)],
    ),
    Case(
        ka.SegmentEmbedding,
        {"num_segments": 3, "embedding_dim": 8, "embeddings_initializer": "he_normal"},
        [ids(2, 5, high=3)],
    ),
    Case(
        ka.PositionEmbedding, {"sequence_length": 16, "initializer": "he_normal"}, [floats(2, 5, 8)]
    ),
    Case(
        ka.SinusoidalPositionEncoding,
        {"max_wavelength": 500, "layout": "halves"},
        [floats(2, 5, 7)],
    ),
    Case(
        ka.RelativePositionBias,
        {
            "num_heads": 3,
            "num_buckets": 8,
            "max_distance": 20,
            "bidirectional": False,
            "embeddings_initializer": "he_normal",
        },
        [floats(2, 5, 7)],
    ),
    Case(
        ka.RotaryEmbedding,
        {
            "max_wavelength": 500,
            "scaling_factor": 2.0,
            "sequence_axis": 1,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 4,
            },
        },
        [floats(2, 5, 2, 8)],
    ),
    Case(
        ka.TokenAndPositionEmbedding,
        {
            "vocabulary_size": 50,
            "sequence_length": 16,
            "embedding_dim": 8,
            "num_segments": 2,
            "position_encoding": "sinusoidal",
            "mask_zero": True,
            "use_layer_norm": True,
            "layer_norm_epsilon": 1e-6,
            "dropout": 0.1,
            "embeddings_initializer": "he_normal",
        },
        [ids(2, 5), ids(2, 5, high=2)],
    ),
    Case(
        ka.FeedForward,
        {
            "intermediate_dim": 32,
            "activation": "gelu",
            "dropout": 0.1,
            "output_dim": 12,
            "use_bias": False,
            "kernel_initializer": "he_normal",
            "bias_initializer": "ones",
            "gated": True,
        },
        [floats(2, 5, 16)],
    ),
]

BLOCK_KWARGS = {
    "num_heads": 4,
    "intermediate_dim": 32,
    "dropout": 0.1,
    "attention_dropout": 0.05,
    "activation": "gelu_tanh",
    "normalize_first": True,
    "layer_norm_epsilon": 1e-6,
    "key_dim": 6,
    "num_key_value_heads": 2,
    "score": "scaled_dot",
    "kernel_initializer": "he_normal",
    "bias_initializer": "ones",
    "normalization": "rms_norm",
    "gated_feed_forward": True,
    "attention_bias": False,
    "attention_output_bias": True,
    "feed_forward_bias": False,
    "rope_max_wavelength": 500.0,
    "rope_scaling": {"rope_type": "linear", "factor": 2.0},
}
CASES += [
    Case(ka.TransformerEncoder, BLOCK_KWARGS, [floats(2, 5, 16)]),
    Case(ka.TransformerDecoder, BLOCK_KWARGS, [floats(2, 5, 16), floats(2, 7, 16)]),
]

CASE_IDS = [c.name for c in CASES]


def public_layer_classes():
    """Every public `keras.layers.Layer` subclass exported by `keras_attn` (not abstract bases)."""
    classes = []
    for name in ka.__all__:
        obj = getattr(ka, name)
        if isinstance(obj, type) and issubclass(obj, keras.layers.Layer) and obj is not ka.Score:
            classes.append(obj)
    return classes


def to_numpy(x):
    return keras.ops.convert_to_numpy(x)


def gradients(fn, *inputs):
    """The gradients of the scalar `fn(*inputs)` with respect to every input, as numpy arrays,
    by the backend's own automatic differentiation (TensorFlow tape, `jax.grad`, autograd)."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        xs = [tf.constant(x) for x in inputs]
        with tf.GradientTape() as tape:
            tape.watch(xs)
            y = fn(*xs)
        return [g.numpy() for g in tape.gradient(y, xs)]
    if backend == "jax":
        import jax

        grads = jax.grad(fn, argnums=tuple(range(len(inputs))))(*inputs)
        return [np.asarray(g) for g in grads]
    import torch

    xs = [torch.tensor(x, requires_grad=True) for x in inputs]
    fn(*xs).backward()
    return [x.grad.numpy() for x in xs]


def run_in_fresh_process(script, *args, backend=None):
    """Runs `python -c script args...` in a new interpreter; returns the JSON it printed on a
    line starting with `RESULT ` (fresh-process loading, logical devices, other backends)."""
    import json
    import os
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", script, *map(str, args)],
        capture_output=True,
        text=True,
        env={**os.environ, "KERAS_BACKEND": backend or keras.backend.backend()},
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(li for li in proc.stdout.splitlines() if li.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


def stream_together(batcher, calls):
    """Each `batcher.stream(*args)` of `calls` in a thread of its own, all started at once
    (so that they share decode steps); the ids of each, in order."""
    together: list = [None] * len(calls)
    start = threading.Barrier(len(calls))

    def run(i):
        start.wait()
        together[i] = list(batcher.stream(*calls[i]))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return together
