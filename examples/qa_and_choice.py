"""Span QA and multiple choice on small generated tasks that need the context to answer.

Each context states where a few animals are ("the cat is in the kitchen . the dog is in the
garden ."), with places drawn at random, so a question ("where is the dog ?") can only be
answered by reading the context:
- `SpanQA` marks the answer in the context (start and end token); decoded with `best_spans`
  (start ≤ end, at most 2 tokens, inside the context); scored by exact match.
- `MultipleChoice` scores four candidate places, each packed with the context and question;
  scored by accuracy (chance: 25%).

    python examples/qa_and_choice.py
"""

import argparse

import keras
import numpy as np

from keras_attn.metrics import exact_match
from keras_attn.models import Encoder, MultipleChoice, SpanQA, best_spans

ANIMALS = ["cat", "dog", "bird", "fish", "horse", "cow", "fox", "owl"]
PLACES = ["kitchen", "garden", "barn", "river", "forest", "attic", "cellar", "field", "hall"]
WORDS = ["[PAD]", "[CLS]", "[SEP]", "the", "is", "in", "where", "?", ".", *ANIMALS, *PLACES]
IDS = {w: i for i, w in enumerate(WORDS)}


def make_stories(n, seed, facts=3):
    rng = np.random.default_rng(seed)
    stories = []
    for _ in range(n):
        animals = rng.choice(ANIMALS, size=facts, replace=False)
        places = rng.choice(PLACES, size=facts, replace=False)
        context = " ".join(f"the {a} is in the {p} ." for a, p in zip(animals, places, strict=True))
        asked = int(rng.integers(facts))
        others = [p for p in PLACES if p != places[asked]]
        wrong = list(rng.choice(others, size=3, replace=False))
        stories.append((context, f"where is the {animals[asked]} ?", places[asked], wrong))
    return stories


def pack(question, context, length):
    """`[CLS] question [SEP] context [SEP]` ids and segments; context token offset."""
    q, c = question.split(), context.split()
    words = ["[CLS]", *q, "[SEP]", *c, "[SEP]"]
    ids = np.zeros(length, "int32")
    ids[: len(words)] = [IDS[w] for w in words]
    segments = np.zeros(length, "int32")
    segments[len(q) + 2 : len(words)] = 1
    return ids, segments, len(q) + 2


def qa_arrays(stories, length=40):
    ids, segments, starts, allowed = [], [], [], []
    for context, question, answer, _ in stories:
        i, s, offset = pack(question, context, length)
        ids.append(i)
        segments.append(s)
        starts.append(offset + context.split().index(answer))
        mask = np.zeros(length, bool)
        mask[offset : offset + len(context.split())] = True
        allowed.append(mask)
    inputs = {"token_ids": np.stack(ids), "segment_ids": np.stack(segments)}
    return inputs, np.array(starts), np.stack(allowed)


def choice_arrays(stories, seed, length=40):
    rng = np.random.default_rng(seed)
    ids, segments, labels = [], [], []
    for context, question, answer, wrong in stories:
        options = [answer, *wrong]
        order = rng.permutation(4)
        packed = [pack(f"{question} {options[k]}", context, length) for k in order]
        ids.append([p[0] for p in packed])
        segments.append([p[1] for p in packed])
        labels.append(int(np.argmax(order == 0)))
    return {"token_ids": np.array(ids), "segment_ids": np.array(segments)}, np.array(labels)


def encoder():
    return Encoder(len(WORDS), 40, hidden_dim=64, num_layers=2, num_heads=4, dropout=0.0)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=int, default=6000)
    parser.add_argument("--test", type=int, default=500)
    parser.add_argument("--epochs", type=int, default=6)
    args = parser.parse_args(argv)
    train, test = make_stories(args.train, 0), make_stories(args.test, 1)
    results = {}

    keras.utils.set_random_seed(0)
    qa = SpanQA(encoder())
    qa.compile(optimizer=keras.optimizers.Adam(1e-3))
    inputs, starts, _ = qa_arrays(train)
    qa.fit(inputs, {"start_logits": starts, "end_logits": starts}, batch_size=64,
           epochs=args.epochs, verbose=2)  # fmt: skip
    inputs, starts, allowed = qa_arrays(test)
    logits = qa.predict(inputs, verbose=0)
    first, last, _ = best_spans(logits["start_logits"], logits["end_logits"], 2, allowed)
    words = [[WORDS[i] for i in row] for row in inputs["token_ids"]]
    answers = [" ".join(w[s : e + 1]) for w, s, e in zip(words, first, last, strict=True)]
    results["span_qa_exact_match"] = exact_match(answers, [s[2] for s in test])
    print(f"span QA exact match: {results['span_qa_exact_match']:.3f}")

    keras.utils.set_random_seed(0)
    choice = MultipleChoice(encoder(), 4)
    choice.compile(optimizer=keras.optimizers.Adam(1e-3), metrics=["accuracy"])
    inputs, labels = choice_arrays(train, 0)
    choice.fit(inputs, labels, batch_size=32, epochs=args.epochs, verbose=2)
    inputs, labels = choice_arrays(test, 1)
    predicted = choice.predict(inputs, verbose=0).argmax(-1)
    results["multiple_choice_accuracy"] = float((predicted == labels).mean())
    print(f"multiple choice accuracy: {results['multiple_choice_accuracy']:.3f} (chance 0.25)")
    return results


if __name__ == "__main__":
    main()
