"""The lecture's A/B task: after a sequence of A's and B's, the next symbol is B if any B
occurred so far, else A.

A one-layer causal attention model can look up "is there a B anywhere before me" directly: a
query learns to put its weight on B keys, however many A's surround them. An averaging model,
whose weights are uniform over the prefix, only sees the fraction of B's, which a single B in a
long prefix barely moves. Both are trained the same way on sequences of `--length` symbols and
tested on that length and on sequences `--test-factor` times longer (neither uses positions,
so both apply to any length); the script prints their held-out accuracies.

    python examples/ab_task.py
"""

import argparse

import keras
import numpy as np

from keras_attn import Attention, TokenEmbedding

A, B = 1, 2


def make_data(n, length, seed=0):
    """Sequences with B rare (about one sequence in two has any), targets per position."""
    rng = np.random.default_rng(seed)
    p_b = rng.uniform(0.0, 2.0 / length, size=(n, 1))
    x = np.where(rng.random((n, length)) < p_b, B, A).astype("int32")
    y = np.where(np.maximum.accumulate(x == B, axis=1), B, A).astype("int32")
    return x, y


@keras.saving.register_keras_serializable(package="examples")
class PrefixMean(keras.layers.Layer):
    """Uniform attention over the prefix: position t gets the mean of positions 0..t."""

    def call(self, x):
        steps = keras.ops.arange(1, keras.ops.shape(x)[1] + 1, dtype=x.dtype)
        return keras.ops.cumsum(x, axis=1) / keras.ops.reshape(steps, (1, -1, 1))


def build(kind, dim=16):
    ids = keras.Input((None,), dtype="int32")
    x = TokenEmbedding(3, dim)(ids)
    if kind == "attention":
        x = Attention(score="scaled_dot", key_dim=dim, value_dim=dim)(x, use_causal_mask=True)
    else:
        x = PrefixMean()(x)
    logits = keras.layers.Dense(3)(keras.layers.Dense(dim, activation="relu")(x))
    return keras.Model(ids, logits, name=kind)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=32)
    parser.add_argument("--samples", type=int, default=8000)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--test-factor", type=int, default=4)
    args = parser.parse_args(argv)
    x, y = make_data(args.samples, args.length)
    tests = {
        "same_length": make_data(1000, args.length, seed=1),
        "longer": make_data(1000, args.length * args.test_factor, seed=2),
    }
    results = {}
    for kind in ("attention", "averaging"):
        keras.utils.set_random_seed(0)
        model = build(kind)
        model.compile(
            optimizer=keras.optimizers.Adam(3e-3),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        model.fit(x, y, batch_size=64, epochs=args.epochs, verbose=0)
        results[kind] = {}
        for name, (x_test, y_test) in tests.items():
            correct = model.predict(x_test, verbose=0).argmax(-1) == y_test
            results[kind][name] = float(correct.mean())
        same, longer = results[kind]["same_length"], results[kind]["longer"]
        print(f"{kind:<10} accuracy at length {args.length}: {same:.4f}"
              f"   at length {args.length * args.test_factor}: {longer:.4f}")  # fmt: skip
    return results


if __name__ == "__main__":
    main()
