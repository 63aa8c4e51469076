"""The pre-Transformer baseline: an LSTM encoder-decoder with additive (Bahdanau) attention,
on the dates → ISO task of `dates_seq2seq.py`.

The encoder LSTM reads the source characters; the decoder LSTM starts from the encoder's final
state and reads the target shifted right; at every target step our `Attention` layer (additive
score, `vᵀ tanh(W_q q + W_k k)`) weighs the encoder states, skipping padded source positions,
and the context joins the decoder state to predict the next character. Decoding is greedy with
full recomputation. Prints exact match and character BLEU, comparable with the Transformer's.

    python examples/dates_lstm_attention.py
"""

import argparse

import keras
import numpy as np

from examples.dates_seq2seq import evaluate
from keras_attn import Attention
from keras_attn.data.dates import END, START, VOCABULARY, date_arrays, decode, make_dates


def build(vocabulary_size, units=96, embedding_dim=32):
    source = keras.Input((None,), dtype="int32", name="encoder_token_ids")
    target = keras.Input((None,), dtype="int32", name="decoder_token_ids")
    embed = keras.layers.Embedding(vocabulary_size, embedding_dim, mask_zero=True)
    states, h, c = keras.layers.LSTM(units, return_sequences=True, return_state=True,
                                     name="encoder_lstm")(embed(source))  # fmt: skip
    decoded = keras.layers.LSTM(units, return_sequences=True, name="decoder_lstm")(
        embed(target), initial_state=[h, c]
    )
    context = Attention(score="additive", name="attention")(
        decoded, states, value_mask=keras.ops.not_equal(source, 0)
    )
    x = keras.layers.Concatenate()([decoded, context])
    x = keras.layers.Dense(units, activation="tanh")(x)
    logits = keras.layers.Dense(vocabulary_size, name="logits")(x)
    return keras.Model({"encoder_token_ids": source, "decoder_token_ids": target}, logits)


def greedy(model, sources, max_length=11):
    """Greedy decoding, the whole target prefix recomputed at each step."""
    targets = np.full((len(sources), 1), START, "int32")
    for _ in range(max_length):
        logits = model.predict({"encoder_token_ids": sources, "decoder_token_ids": targets},
                               verbose=0)  # fmt: skip
        logits[:, -1, 0] = -np.inf
        targets = np.concatenate([targets, logits[:, -1].argmax(-1)[:, None]], axis=1)
    return [list(row[1:]) for row in targets]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=int, default=20000)
    parser.add_argument("--test", type=int, default=300)
    parser.add_argument("--epochs", type=int, default=6)
    args = parser.parse_args(argv)

    keras.utils.set_random_seed(0)
    train_pairs, test_pairs = make_dates(args.train), make_dates(args.test, seed=1)
    sources, inputs, targets = date_arrays(train_pairs)
    model = build(len(VOCABULARY))
    model.compile(
        optimizer=keras.optimizers.Adam(3e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=0),
    )
    model.fit({"encoder_token_ids": sources, "decoder_token_ids": inputs}, targets,
              batch_size=64, epochs=args.epochs, verbose=2)  # fmt: skip
    predictions = greedy(model, date_arrays(test_pairs)[0])
    results = evaluate([decode([*row, END]) for row in predictions], test_pairs)
    print(f"LSTM + additive attention: exact match {results['exact_match']:.3f}  "
          f"char BLEU {results['bleu']:.1f}")  # fmt: skip
    return results


if __name__ == "__main__":
    main()
