"""The main job: train a small causal LM on Shakespeare, export it, run it in onnxruntime.

    python examples/shakespeare_lm.py                  # ~2 minutes of training on 2 CPU cores
    python examples/shakespeare_lm.py --minutes 0.2    # a quick look

Steps: load the embedded corpus (Shakespeare, or stdlib docstrings without the `shakespeare`
package) -> learn a WordPiece vocabulary (tensorflow-text) -> cut plays into 64-token windows,
the last of each play padded -> `model.fit` a GPT-style model built from keras_attn layers for a
time budget -> held-out perplexity -> export SavedModel + ONNX with a parity check -> greedy
generation from the ONNX file through `serving.Predictor` (no TensorFlow in that path) -> the
decode graph again with int8 and int4 weights (`weights=`), and what that costs the trained
model: held-out perplexity through each graph, beside the float32 one's on the same windows.
"""

import argparse
import json
import time
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf
from keras_attn_export import export_model
from keras_attn_serving import Predictor

from keras_attn.callbacks import TimeBudget
from keras_attn.data import lm_windows, load_corpus
from keras_attn.metrics import Perplexity
from keras_attn.models import build_causal_lm, lm_loss
from keras_attn.tokenizers import WordPieceTokenizer, train_wordpiece_vocabulary


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--corpus", default="default", choices=["default", "shakespeare", "stdlib"])
    p.add_argument("--minutes", type=float, default=2.0, help="training time budget")
    p.add_argument("--vocabulary-size", type=int, default=4000)
    p.add_argument("--vocabulary-lines", type=int, default=40000, help="lines to learn it from")
    p.add_argument("--sequence-length", type=int, default=64)
    p.add_argument("--hidden-dim", type=int, default=128)
    p.add_argument("--num-layers", type=int, default=2)
    p.add_argument("--num-heads", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-documents", type=int, default=None, help="use only the first N")
    p.add_argument("--prompt", default="to be or not to be")
    p.add_argument("--new-tokens", type=int, default=24)
    p.add_argument("--out", default="artifacts/shakespeare_lm")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--weights",
        nargs="*",
        default=["int8", "int4"],
        choices=["int8", "int4"],
        help="weight-only decode graphs to export and score (none: skip)",
    )
    p.add_argument(
        "--scored-windows",
        type=int,
        default=32,
        help="held-out windows the decode graphs' perplexity is measured on",
    )
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    keras.utils.set_random_seed(args.seed)
    corpus = load_corpus(args.corpus)
    documents = corpus.documents[: args.max_documents]
    print(
        f"corpus: {corpus.name}, {len(documents)} documents, "
        f"{sum(map(len, documents)):,} characters"
    )

    t0 = time.perf_counter()
    lines = [ln for doc in documents for ln in doc.splitlines() if ln.strip()]
    vocabulary = train_wordpiece_vocabulary(lines[: args.vocabulary_lines], args.vocabulary_size)
    tokenizer = WordPieceTokenizer(vocabulary)
    ids = [tokenizer.tokenize(doc).numpy() for doc in documents]
    x, y = lm_windows(ids, args.sequence_length)
    order = np.random.default_rng(args.seed).permutation(len(x))
    split = max(1, len(x) // 20)
    val, train = order[:split], order[split:]
    batch_size = min(args.batch_size, len(train))
    print(
        f"vocabulary: {len(vocabulary)} WordPiece tokens; {sum(map(len, ids)):,} tokens; "
        f"{len(train)} training / {len(val)} held-out windows "
        f"({time.perf_counter() - t0:.1f} s)"
    )

    model = build_causal_lm(
        len(vocabulary),
        args.sequence_length,
        hidden_dim=args.hidden_dim,
        num_layers=args.num_layers,
        num_heads=args.num_heads,
        dropout=0.1,
    )
    model.compile(
        optimizer=keras.optimizers.AdamW(learning_rate=2e-3, weight_decay=0.01, clipnorm=1.0),
        loss=lm_loss(),
        metrics=[Perplexity()],
        jit_compile=True,  # Keras's "auto" skips XLA on CPU; here it is ~30% faster per step
    )
    budget = TimeBudget(args.minutes * 60)
    steps = len(train) // batch_size
    # One endless stream, reshuffled each pass: `fit` never exhausts its iterator mid-epoch
    # ("ran out of data") and rebuilds it, the step after which stalled 34-55 s in 3 of 6
    # runs. Whole batches only: a last short batch would recompile the XLA train step (~5 s).
    stream = (
        tf.data.Dataset.from_tensor_slices((x[train], y[train]))
        .shuffle(len(train), seed=args.seed)
        .batch(batch_size, drop_remainder=True)
        .repeat()
        .prefetch(tf.data.AUTOTUNE)
    )
    model.fit(
        stream,
        epochs=1000,
        callbacks=[budget],
        steps_per_epoch=min(steps, 100),
        verbose=2 if args.minutes < 0.1 else 1,
    )
    held_out = model.evaluate(x[val], y[val], batch_size=64, verbose=0, return_dict=True)
    trained_steps = int(keras.ops.convert_to_numpy(model.optimizer.iterations))
    print(
        f"trained {budget.elapsed:.0f} s ({trained_steps} steps of {batch_size}); "
        f"held-out perplexity {held_out['perplexity']:.1f} (uniform guess: {len(vocabulary)})"
    )

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    model.save(out.with_suffix(".keras"))
    print("\nparity, Keras vs exported artifacts:")
    manifest = export_model(model, out, tokenizer=tokenizer)

    decoding = manifest["decoding"]
    graphs = [decoding, decoding["gqa"]] if decoding["gqa"]["file"] else [decoding]
    for graph in graphs:
        print(f"{graph['file']}: logits at every decoding step within "
              f"{graph['step_logits_max_abs_diff']:.1e} of Keras; greedy ids equal Keras "
              f"generate(): {graph['greedy_equals_keras']}")  # fmt: skip

    predictor = Predictor(out)
    sample = predictor.generate([args.prompt], max_new_tokens=args.new_tokens)[0]
    print(f"\ngenerated by onnxruntime (greedy, {graphs[-1]['file']}): {sample}")
    summary = {
        "corpus": corpus.name,
        "train_seconds": round(budget.elapsed, 1),
        "train_steps": trained_steps,
        "held_out_perplexity": held_out["perplexity"],
        "parity_max_abs_diff": manifest["parity"]["max_abs_diff"],
        "decoding_step_max_abs_diff": max(g["step_logits_max_abs_diff"] for g in graphs),
        "sample": sample,
    }
    if args.weights:
        windows = val[: args.scored_windows]
        scored = model.evaluate(x[windows], y[windows], batch_size=64, verbose=0,
                                return_dict=True)  # fmt: skip
        summary["weights"] = weight_only_costs(model, tokenizer, out, args.weights, x[windows],
                                               y[windows], scored["perplexity"])  # fmt: skip
    print(
        f"\nartifacts: {out}/ (saved_model/, model.onnx, "
        f"{', '.join(g['file'] for g in graphs)}, tokenizer/, manifest.json) "
        f"and {out.with_suffix('.keras')}"
    )
    print(json.dumps(summary))
    return summary


def graph_perplexity(folder, x, y):
    """Held-out perplexity through an artifact's decode graph: each window teacher-forced,
    one position a step, over the targets that are not padding (as `Perplexity`)."""
    from keras_attn_serving.generation import BoundCache

    predictor = Predictor(folder)
    total, count = 0.0, 0
    for window, targets in zip(x, y, strict=True):
        state = BoundCache(predictor.gqa_session, predictor.gqa, 1)
        for t in range(int(np.count_nonzero(window))):  # padding only ends a play's last window
            logits, state = predictor.gqa_step(window[None, t : t + 1], state, t)
            if targets[t]:
                row = logits[0].astype(np.float64)
                total -= row[targets[t]] - row.max() - np.log(np.exp(row - row.max()).sum())
                count += 1
    return float(np.exp(total / count))


def weight_only_costs(model, tokenizer, out, weights, x, y, keras_perplexity):
    """Exports the decode graph with each of `weights` and scores it on the trained model:
    the export's own record (top-1 agreement and worst logit gap against the float model on
    held-out text) and the held-out perplexity through each graph, float32's included."""
    print(f"\nweight-only decode graphs, {len(x)} held-out windows:")
    float_perplexity = graph_perplexity(out, x, y)
    print(f"float32: perplexity {float_perplexity:.2f} (Keras on the same windows: "
          f"{keras_perplexity:.2f})")  # fmt: skip
    costs = {"float32": {"perplexity": float_perplexity, "keras_perplexity": keras_perplexity}}
    for kind in weights:
        folder = out.with_name(f"{out.name}_{kind}")
        manifest = export_model(model, folder, formats=["generation"], tokenizer=tokenizer,
                                weights=kind, verbose=False)  # fmt: skip
        gqa = manifest["decoding"]["gqa"]
        record = gqa["weights"]
        # The decode graph and its weights file (not a prefill twin beside them).
        files = [name for name in (gqa["file"], gqa["external_data"]) if name]
        perplexity = graph_perplexity(folder, x, y)
        costs[kind] = {
            "perplexity": perplexity,
            "top1_agreement": record["quality"]["top1_agreement"],
            "max_abs_logit_diff": record["quality"]["max_abs_logit_diff"],
            "accuracy_level": record["accuracy_level"],
            "file_bytes": sum((folder / name).stat().st_size for name in files),
        }
        print(
            f"{kind}: perplexity {perplexity:.2f} ({perplexity / float_perplexity:.3f}x "
            f"float32); top-1 agreement {record['quality']['top1_agreement']:.1%} over "
            f"{record['quality']['positions']} positions of {record['quality']['source']}, "
            f"worst logit gap {record['quality']['max_abs_logit_diff']:.3f} "
            f"(accuracy level {record['accuracy_level']}); {folder}/"
        )
    return costs


if __name__ == "__main__":
    main()
