"""BERT-style pretraining (masked LM + next-sentence prediction), then fine-tuning.

1. Pretrain: the training tweets' text, unlabeled, becomes sentence pairs: each tweet is cut
   in two at a random point; half the pairs keep the true second part (NSP label 1), half get
   another tweet's (label 0). `MaskedLMMaskGenerator` corrupts 15% of the tokens and
   `EncoderPretrainer` learns both tasks together.
2. Fine-tune on sentiment with few labels (`--labeled`), starting from the pretrained encoder,
   and, for comparison, from a freshly initialized one, with the same budget.
Prints masked-token accuracy, NSP accuracy, and both held-out sentiment accuracies.

    python examples/pretrain_finetune.py
"""

import argparse
import sys
from pathlib import Path

import keras
import numpy as np

if __package__ in (None, ""):  # run as `python examples/NAME.py`: its siblings import too
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from examples.sentiment import encode, make_encoder, make_tokenizer, train_classifier
from keras_attn.data import load_tweet_sentiment
from keras_attn.metrics import MaskedAccuracy
from keras_attn.models import EncoderPretrainer
from keras_attn.optimizers import WarmupDecay, adamw
from keras_attn.preprocessing import MaskedLMMaskGenerator, SegmentPacker


def sentence_pairs(tokenizer, texts, sequence_length, seed=0):
    """Packed `[CLS] a [SEP] b [SEP]` pairs and NSP labels (1 = b really follows a)."""
    rng = np.random.default_rng(seed)
    ids = [row for row in tokenizer(list(texts)).to_list() if len(row) >= 4]
    cuts = [int(rng.integers(1, len(row))) for row in ids]
    firsts = [row[:c] for row, c in zip(ids, cuts, strict=True)]
    seconds = [row[c:] for row, c in zip(ids, cuts, strict=True)]
    labels = (rng.random(len(ids)) < 0.5).astype("int32")
    others = rng.permutation(len(ids))
    seconds = [
        s if keep else seconds[o] for s, keep, o in zip(seconds, labels, others, strict=True)
    ]
    import tensorflow as tf

    packer = SegmentPacker(
        sequence_length, tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    )
    packed = packer((tf.ragged.constant(firsts), tf.ragged.constant(seconds)))
    return {k: np.asarray(packed[k]) for k in ("token_ids", "segment_ids")}, labels


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pretrain-epochs", type=int, default=4)
    parser.add_argument("--finetune-epochs", type=int, default=4)
    parser.add_argument("--labeled", type=int, default=2000, help="labeled tweets to fine-tune on")
    parser.add_argument("--max-pretrain", type=int, default=None, help="use fewer tweets")
    parser.add_argument("--max-test", type=int, default=None)
    parser.add_argument("--sequence-length", type=int, default=48)
    args = parser.parse_args(argv)

    keras.utils.set_random_seed(0)
    train, test = load_tweet_sentiment()
    test = test[: args.max_test]
    texts = [t for t, _ in train[: args.max_pretrain]]
    tokenizer = make_tokenizer(texts)
    pairs, nsp = sentence_pairs(tokenizer, texts, args.sequence_length)
    specials = [tokenizer.token_to_id(t) for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")]
    masker = MaskedLMMaskGenerator(
        tokenizer.vocabulary_size(), tokenizer.token_to_id("[MASK]"), mask_selection_length=8,
        unselectable_token_ids=specials,
    )  # fmt: skip
    masked = {k: np.asarray(v) for k, v in masker(pairs["token_ids"]).items()}

    encoder = make_encoder(tokenizer.vocabulary_size(), args.sequence_length)
    pretrainer = EncoderPretrainer(encoder)
    steps = args.pretrain_epochs * -(-len(nsp) // 64)
    pretrainer.compile(
        optimizer=adamw(WarmupDecay(1e-3, steps // 10, steps)),
        metrics={"mlm": MaskedAccuracy(), "nsp": "accuracy"},
    )
    inputs = {"token_ids": masked["token_ids"], "segment_ids": pairs["segment_ids"],
              "mask_positions": masked["mask_positions"]}  # fmt: skip
    history = pretrainer.fit(inputs, {"mlm": masked["mask_ids"], "nsp": nsp}, batch_size=64,
                             epochs=args.pretrain_epochs, verbose=2).history  # fmt: skip
    results = {
        "masked_token_accuracy": float(history["mlm_masked_accuracy"][-1]),
        "nsp_accuracy": float(history["nsp_accuracy"][-1]),
    }

    labeled = train[: args.labeled]
    x = encode(tokenizer, [t for t, _ in labeled], args.sequence_length)
    y = np.array([label for _, label in labeled])
    x_test = encode(tokenizer, [t for t, _ in test], args.sequence_length)
    y_test = np.array([label for _, label in test])
    results["finetuned_accuracy"], _ = train_classifier(encoder, x, y, x_test, y_test,
                                                     args.finetune_epochs)  # fmt: skip
    keras.utils.set_random_seed(0)
    scratch = make_encoder(tokenizer.vocabulary_size(), args.sequence_length)
    results["scratch_accuracy"], _ = train_classifier(scratch, x, y, x_test, y_test,
                                                   args.finetune_epochs)  # fmt: skip
    print(
        f"pretraining: masked-token accuracy {results['masked_token_accuracy']:.3f}, "
        f"NSP accuracy {results['nsp_accuracy']:.3f}"
    )
    print(
        f"sentiment with {len(y)} labels: pretrained {results['finetuned_accuracy']:.3f} "
        f"vs from scratch {results['scratch_accuracy']:.3f} on {len(y_test)} tweets"
    )
    return results


if __name__ == "__main__":
    main()
