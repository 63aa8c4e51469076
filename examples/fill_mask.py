"""Fill-mask on the packaged MiniLM's vocabulary: `MaskedLM.from_pretrained` and `fill_mask`.

A checkpoint that carries its masked-LM head (BERT's `cls.predictions.*`, RoBERTa's
`lm_head.*`) fills masks as it does in `transformers` straight away (tested). The packaged
all-MiniLM-L6-v2 is a sentence-transformers encoder without that head, so here the head is
trained for a short while on Shakespeare, the encoder frozen, before it fills masks.

    python examples/fill_mask.py                   # ~2 minutes on 2 CPU cores
"""

import argparse

import keras
import numpy as np

from keras_attn.data import checkpoint_folder, load_corpus
from keras_attn.models import MaskedLM

SENTENCES = [
    "to be or not to be, that is the [MASK].",
    "the king is [MASK].",
    "a horse! a horse! my [MASK] for a horse!",
]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=20000, help="Shakespeare lines to train on")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--sequence-length", type=int, default=24)
    args = parser.parse_args(argv)

    keras.utils.set_random_seed(0)
    lm = MaskedLM.from_pretrained(checkpoint_folder(), sequence_length=args.sequence_length,
                                  backbone_kwargs={"dropout": 0.0})  # fmt: skip
    lm.backbone.trainable = False  # the head alone learns: fast, and MiniLM stays itself
    lines = [line for line in load_corpus().lines() if len(line.split()) >= 4]
    train, held_out = lines[: args.lines], lines[-500:]
    lm.compile(optimizer=keras.optimizers.Adam(1e-3), weighted_metrics=["accuracy"])
    before = lm.evaluate(held_out, verbose=0, return_dict=True)
    lm.fit(train, batch_size=64, epochs=args.epochs, verbose=2)
    after = lm.evaluate(held_out, verbose=0, return_dict=True)
    print(f"held-out masked-token accuracy {before['accuracy']:.3f} -> {after['accuracy']:.3f}")
    for sentence, masks in zip(SENTENCES, lm.fill_mask(SENTENCES, top_k=5), strict=True):
        print(f"{sentence}\n  " + ", ".join(f"{t} ({p:.2f})" for t, p in masks[0]))
    return {
        "accuracy_before": float(before["accuracy"]),
        "accuracy_after": float(after["accuracy"]),
        "top_probability": float(np.mean([m[0][0][1] for m in lm.fill_mask(SENTENCES)])),
    }


if __name__ == "__main__":
    main()
