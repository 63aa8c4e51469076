"""Benchmark: training a GPT-2-small-size `CausalLM` on a GPU under JAX in mixed bfloat16,
tokens/s and MFU against keras-hub's GPT-2 and the same decoder in plain Keras, in one run.

    KERAS_BACKEND=jax python bench/gpu_train.py             # GPT-2 small: vocab 50257, 1024
                                                            # positions, d 768, 12 heads, 12
                                                            # layers, ffn 3072; batch 32
    KERAS_BACKEND=jax python bench/gpu_train.py --tiny      # the CPU check of the script

`bench/gpu.sh` runs it on a lent GPU machine (JAX, no TensorFlow, no network: Keras and
keras-hub travel as wheels). Each model trains with `fit` (Adam, dropout 0, `jit_compile`
on); a warm-up `fit` pays compilation, then tokens/s is measured from the first timed step's
start until the weights are ready on the device, median over rounds.

Targets are the inputs themselves (not shifted): the loss means nothing, the work per step
is a language model's. MFU counts the PaLM way: 6 x (matmul parameters) + 12 x layers x
width x length FLOPs per token (attention scores and values counted in full, although
causal kernels skip half), over the bfloat16 matmul rate measured in the same run (a
square product) and over the datasheet's dense rate where the device is known. The
fused-attention check lowers each model's forward pass and looks for cuDNN's fused
attention (`__cudnn$fmha`) in it.
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time
import traceback

os.environ.setdefault("KERAS_BACKEND", "jax")
_HERE = os.path.dirname(os.path.abspath(__file__))
# bench/tokenizers.py would shadow the `tokenizers` package keras-hub imports.
sys.path = [os.path.dirname(_HERE)] + [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_attn.hardware import cpu_flags  # noqa: E402
from keras_attn.models import CausalLM  # noqa: E402

sys.path.append(_HERE)  # last: after site-packages, so `tokenizers` stays the package
from training import plain_keras  # noqa: E402  the same decoder, bench/training.py's

# Dense bfloat16 matmul rates from the vendors' datasheets (SXM parts), FLOP/s.
DATASHEET_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12}

GPT2_SMALL = dict(vocabulary=50257, length=1024, width=768, heads=12, layers=12, ffn=3072)
TINY = dict(vocabulary=512, length=64, width=64, heads=2, layers=2, ffn=256)


def flops_per_token(vocabulary, length, width, heads, layers, ffn):
    """Training FLOPs per token, PaLM's count (appendix B): 6N for the N matmul weights
    (query, key, value, output, the two feed-forward matrices, the tied output projection)
    plus 12 * layers * width * length for attention."""
    matmul_weights = layers * (4 * width * width + 2 * width * ffn) + width * vocabulary
    return 6 * matmul_weights + 12 * layers * width * length


def matmul_rate(size, dtype, repeats=10):
    """FLOP/s of one square `size`^3 product on the default device, median of `repeats`
    after a warm-up, on random data (zeros run faster than real data on some GPUs)."""
    keys = jax.random.split(jax.random.PRNGKey(0), 2)
    a, b = (jax.random.normal(k, (size, size), dtype) for k in keys)
    product = jax.jit(lambda a, b: a @ b)
    product(a, b).block_until_ready()
    times = []
    for _ in range(repeats):  # 10 products queued back to back, one wait: no launch gaps
        start = time.perf_counter()
        jax.block_until_ready([product(a, b) for _ in range(10)])
        times.append((time.perf_counter() - start) / 10)
    return 2 * size**3 / statistics.median(times)


def keras_hub_gpt2(vocabulary, length, width, heads, layers, ffn):
    import keras_hub

    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=vocabulary, num_layers=layers, num_heads=heads, hidden_dim=width,
        intermediate_dim=ffn, dropout=0.0, max_sequence_length=length,
    )  # fmt: skip
    # GPT2CausalLM's own graph (backbone, tied reverse embedding); its `fit` would want
    # grain or TensorFlow for preprocessing, neither of which the GPU machine has.
    hidden = backbone(backbone.input)
    return keras.Model(backbone.input, backbone.token_embedding(hidden, reverse=True))


def ours(vocabulary, length, width, heads, layers, ffn):
    return CausalLM(vocabulary, length, hidden_dim=width, num_layers=layers, num_heads=heads,
                    intermediate_dim=ffn, dropout=0.0)  # fmt: skip


def inputs_for(name, ids):
    if name == "keras-hub":
        return {"token_ids": ids, "padding_mask": np.ones_like(ids, dtype=bool)}
    return ids


def fused_attention(model, x):
    """Whether the lowered forward pass calls cuDNN's fused attention kernel."""
    trainable = [v.value for v in model.trainable_variables]
    other = [v.value for v in model.non_trainable_variables]

    def forward(trainable, other, x):
        return model.stateless_call(trainable, other, x, training=True)[0]

    text = jax.jit(forward).lower(trainable, other, x).as_text()
    return "__cudnn$fmha" in text


def flash_available(heads, width):
    """None where `keras.ops.dot_product_attention(flash_attention=True)` runs on causal
    bfloat16 heads of this shape, else the reason it gives."""
    q = keras.random.normal((1, 128, heads, width // heads), dtype="bfloat16")
    try:
        keras.ops.dot_product_attention(q, q, q, is_causal=True, flash_attention=True)
    except Exception as error:  # the reason is what this reports
        return f"{type(error).__name__}: {error}"[:300]
    return None


class FirstStep(keras.callbacks.Callback):
    """The first step's start; async-safe, so `fit` never waits on a step's logs."""

    async_safe = True

    def on_train_batch_begin(self, batch, logs=None):
        if batch == 0:
            self.start = time.perf_counter()


def measure(name, build, shape, ids, args):
    """Tokens/s of each round's timed `fit`, and whether attention ran fused."""
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        keras.utils.set_random_seed(0)
        model = build(**shape)
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        model.compile(optimizer=keras.optimizers.Adam(1e-4), loss=loss, jit_compile=True)
        x = inputs_for(name, ids)
        warm = inputs_for(name, ids[: 2 * args.batch])
        model.fit(warm, ids[: 2 * args.batch], batch_size=args.batch, verbose=0)
        rates = []
        for _ in range(args.rounds):
            clock = FirstStep()
            model.fit(x, ids, batch_size=args.batch, verbose=0, callbacks=[clock])
            jax.block_until_ready([v.value for v in model.trainable_variables])
            rates.append(ids.size / (time.perf_counter() - clock.start))
        fused = fused_attention(model, inputs_for(name, ids[:1]))
    finally:
        keras.config.set_dtype_policy(previous)
    return rates, fused


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="a few-layer model, for a CPU")
    parser.add_argument("--batch", type=int, default=None, help="32 (4 with --tiny)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps: 30 (3 --tiny)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--vocabulary", type=int, default=None, help="GPT-2's 50257 (512)")
    parser.add_argument("--models", default="ours,keras-hub,plain keras")
    parser.add_argument("--out", default="bench/results/gpu_train.json")
    args = parser.parse_args(argv)
    shape = dict(TINY if args.tiny else GPT2_SMALL)
    shape["vocabulary"] = args.vocabulary or shape["vocabulary"]
    args.batch = args.batch or (4 if args.tiny else 32)
    args.steps = args.steps or (3 if args.tiny else 30)
    device = jax.devices()[0]
    kind = getattr(device, "device_kind", device.platform)
    print(f"{device.platform}: {kind}; jax {jax.__version__}, keras {keras.__version__}; "
          f"host CPU flags: {' '.join(cpu_flags()) or '(none read)'}", flush=True)  # fmt: skip
    on_gpu = device.platform == "gpu"
    peak = matmul_rate(8192 if on_gpu else 512, "bfloat16" if on_gpu else "float32")
    datasheet = next((rate for key, rate in DATASHEET_BF16.items() if key in kind), None)
    print(f"measured matmul peak: {peak / 1e12:.1f} TFLOP/s"
          + (f"; datasheet {datasheet / 1e12:.0f}" if datasheet else ""), flush=True)  # fmt: skip
    if on_gpu:
        reason = flash_available(shape["heads"], shape["width"])
        print(f"flash attention through keras.ops: {reason or 'available'}", flush=True)
    per_token = flops_per_token(**shape)
    rng = np.random.default_rng(0)
    ids = rng.integers(1, shape["vocabulary"], (args.batch * args.steps, shape["length"]))
    ids = ids.astype("int32")
    builders = {"ours": ours, "keras-hub": keras_hub_gpt2, "plain keras": plain_keras}
    rows = {}
    for name in args.models.split(","):
        try:
            rates, fused = measure(name, builders[name], shape, ids, args)
        except ImportError as error:
            print(f"{name}: skipped ({error})", flush=True)
            traceback.print_exc(limit=-4)
            continue
        rate = statistics.median(rates)
        rows[name] = {
            "tokens_per_s": rate, "rounds": rates, "fused_attention": fused,
            "mfu_measured_peak": rate * per_token / peak,
            "mfu_datasheet": rate * per_token / datasheet if datasheet else None,
        }  # fmt: skip
        print(f"{name}: {rate:,.0f} tokens/s, rounds {[round(r) for r in rates]}, "
              f"fused attention {fused}", flush=True)  # fmt: skip
    print(f"\n{kind}, {platform.node()}: batch {args.batch} x {shape['length']} tokens, "
          f"{per_token / 1e6:.0f} MFLOP per token (PaLM count)")  # fmt: skip
    print(f"{'model':<13}{'tokens/s':>12}{'MFU (measured)':>16}{'MFU (datasheet)':>17}"
          f"{'fused':>7}{'vs ours':>9}")  # fmt: skip
    base = rows.get("ours", {}).get("tokens_per_s")
    for name, row in rows.items():
        sheet = f"{row['mfu_datasheet']:.1%}" if row["mfu_datasheet"] else "-"
        ratio = f"{row['tokens_per_s'] / base:.2f}" if base else "-"
        print(f"{name:<13}{row['tokens_per_s']:>12,.0f}{row['mfu_measured_peak']:>16.1%}"
              f"{sheet:>17}{row['fused_attention']!s:>7}{ratio:>9}")  # fmt: skip
    result = {
        "device": kind, "platform": device.platform, "jax": jax.__version__,
        "keras": keras.__version__, "host_cpu_flags": cpu_flags(), "shape": shape,
        "batch": args.batch, "steps": args.steps, "flops_per_token": per_token,
        "measured_peak_flops": peak, "datasheet_peak_flops": datasheet, "rows": rows,
    }  # fmt: skip
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
