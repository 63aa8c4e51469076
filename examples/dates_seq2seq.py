"""Seq2seq on a generated task: dates written many ways → ISO dates, with beam search.

A small Transformer encoder-decoder (`keras_attn.models.Seq2Seq`) is trained with teacher
forcing on character ids, then decodes held-out dates greedily and with beam search (cached
decoding). Prints exact match and BLEU (sacrebleu over space-separated characters: dates are
too short for word 4-grams).

    python examples/dates_seq2seq.py                 # ~2 minutes on 2 CPU cores
"""

import argparse

import keras

from keras_attn.data.dates import END, START, VOCABULARY, date_arrays, decode, make_dates
from keras_attn.metrics import bleu, exact_match
from keras_attn.models import Seq2Seq
from keras_attn.optimizers import WarmupDecay, adamw


def evaluate(predictions, pairs):
    """Exact match and character BLEU of predicted ISO strings."""
    references = [target for _, target in pairs]
    spaced = lambda texts: [" ".join(text) for text in texts]  # noqa: E731
    return {
        "exact_match": exact_match(predictions, references),
        "bleu": bleu(spaced(predictions), spaced(references)),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=int, default=20000)
    parser.add_argument("--test", type=int, default=300)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--hidden-dim", type=int, default=64)
    parser.add_argument("--num-beams", type=int, default=3)
    args = parser.parse_args(argv)

    keras.utils.set_random_seed(0)
    train_pairs, test_pairs = make_dates(args.train), make_dates(args.test, seed=1)
    sources, inputs, targets = date_arrays(train_pairs)
    model = Seq2Seq(
        len(VOCABULARY), 64, hidden_dim=args.hidden_dim, num_heads=4,
        num_encoder_layers=2, num_decoder_layers=2, dropout=0.1,
    )  # fmt: skip
    steps = args.epochs * -(-len(sources) // 64)
    model.compile(optimizer=adamw(WarmupDecay(2e-3, steps // 10, steps), weight_decay=0.01))
    model.fit({"encoder_token_ids": sources, "decoder_token_ids": inputs}, targets,
              batch_size=64, epochs=args.epochs, verbose=2)  # fmt: skip

    test_sources = [list(row[row != 0]) for row in date_arrays(test_pairs)[0]]
    results = {}
    for name, kwargs in (("greedy", {}), ("beam", {"sampler": "beam",
                                                    "num_beams": args.num_beams})):  # fmt: skip
        ids = model.generate(test_sources, 11, start_id=START, stop_token_ids=[END], **kwargs)
        results[name] = evaluate([decode(row) for row in ids], test_pairs)
        print(f"{name:<7} exact match {results[name]['exact_match']:.3f}  "
              f"char BLEU {results[name]['bleu']:.1f}")  # fmt: skip
    for (source, target), row in list(zip(test_pairs, ids, strict=True))[:3]:
        print(f"  {source!r:>32} -> {decode(row)}  (expected {target})")
    return results


if __name__ == "__main__":
    main()
