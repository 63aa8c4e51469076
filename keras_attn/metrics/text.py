"""Evaluation of predicted tags, answers and generated text.

Where a field has a reference implementation we call it rather than re-derive it, so our
figures compare with published ones: entity-level F1 comes from `seqeval` (the CoNLL
`conlleval` scoring, BIO spans), token-level F1 from scikit-learn, BLEU from `sacrebleu`
(the WMT reference, with its standard tokenizer), and ROUGE from Google's `rouge-score`
(the package that reproduces the original ROUGE-1.5.5 numbers). Exact match follows the
SQuAD evaluation script's normalization. These libraries are in the `metrics` extra.
"""

import re
import string
from collections.abc import Iterable, Sequence
from typing import Any


def _require(module, extra="metrics"):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(
            f"This metric needs `{module}`: pip install 'keras-attn[{extra}]'"
        ) from error


def _check_pairs(name_a, a, name_b, b):
    if len(a) != len(b):
        raise ValueError(
            f"`{name_a}` and `{name_b}` must have the same length. Received: {len(a)} and {len(b)}"
        )


def entity_f1(true_tags: Sequence[Sequence[str]], predicted_tags: Sequence[Sequence[str]]) -> float:
    """Entity-level F1 over BIO-tagged sentences (an entity counts only if its span and type
    both match), micro-averaged over types: `seqeval.metrics.f1_score`.

    Args:
        true_tags, predicted_tags: lists of sentences, each a list of tags like `"B-PER"`.
    """
    _check_pairs("true_tags", true_tags, "predicted_tags", predicted_tags)
    for t, p in zip(true_tags, predicted_tags, strict=True):
        _check_pairs("true_tags[i]", t, "predicted_tags[i]", p)
    seqeval = _require("seqeval.metrics")
    return float(seqeval.f1_score(true_tags, predicted_tags))


def token_f1(
    true_tags: Sequence[Sequence[str]],
    predicted_tags: Sequence[Sequence[str]],
    outside: str = "O",
) -> float:
    """Token-level F1: micro-averaged over tokens, counting only the entity tags (every tag
    but `outside`) as positives: `sklearn.metrics.f1_score(average="micro")`."""
    _check_pairs("true_tags", true_tags, "predicted_tags", predicted_tags)
    flat_true = [tag for sentence in true_tags for tag in sentence]
    flat_pred = [tag for sentence in predicted_tags for tag in sentence]
    _check_pairs("true tokens", flat_true, "predicted tokens", flat_pred)
    metrics = _require("sklearn.metrics")
    labels = sorted({*flat_true, *flat_pred} - {outside})
    if not labels:
        return 0.0
    return float(
        metrics.f1_score(flat_true, flat_pred, labels=labels, average="micro", zero_division=0)
    )


def normalize_answer(text: str) -> str:
    """SQuAD's normalization: lower case, no punctuation, no articles, single spaces."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def exact_match(predictions: Sequence[Any], references: Sequence[Any]) -> float:
    """Share of predictions equal to their reference: strings after `normalize_answer`,
    anything else (id lists, tuples) compared as is."""
    _check_pairs("predictions", predictions, "references", references)
    if not predictions:
        raise ValueError("`predictions` must not be empty.")

    def same(p: Any, r: Any) -> bool:
        if isinstance(p, str) and isinstance(r, str):
            return normalize_answer(p) == normalize_answer(r)
        return list(p) == list(r)

    return sum(same(p, r) for p, r in zip(predictions, references, strict=True)) / len(predictions)


def bleu(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """Corpus BLEU (0–100) of detokenized hypotheses against one reference each:
    `sacrebleu.corpus_bleu` with its default 13a tokenizer."""
    _check_pairs("hypotheses", hypotheses, "references", references)
    sacrebleu = _require("sacrebleu")
    return float(sacrebleu.corpus_bleu(list(hypotheses), [list(references)]).score)


def rouge(
    hypotheses: Sequence[str],
    references: Sequence[str],
    types: Iterable[str] = ("rouge1", "rouge2", "rougeL"),
) -> dict[str, float]:
    """Mean ROUGE F-measures over pairs: `rouge_score.rouge_scorer` (ROUGE-N for `rougeN`,
    longest common subsequence for `rougeL`), without stemming.

    Returns:
        dict like `{"rouge1": 0.5, "rouge2": 0.25, "rougeL": 0.5}`.
    """
    _check_pairs("hypotheses", hypotheses, "references", references)
    if not hypotheses:
        raise ValueError("`hypotheses` must not be empty.")
    scorer = _require("rouge_score.rouge_scorer").RougeScorer(list(types))
    totals = dict.fromkeys(types, 0.0)
    for hypothesis, reference in zip(hypotheses, references, strict=True):
        scores = scorer.score(reference, hypothesis)  # (target, prediction)
        for name in types:
            totals[name] += scores[name].fmeasure
    return {name: total / len(hypotheses) for name, total in totals.items()}
