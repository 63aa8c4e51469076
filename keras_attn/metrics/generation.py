"""The lectures' automatic metrics for generated text beyond BLEU and ROUGE: word error rate,
METEOR and BERTScore, each as a corpus (micro) and a sentence (macro) average.

- Word error rate: `jiwer`'s (word-level Levenshtein edits over reference words). The corpus
  rate pools edits and reference words over all pairs; the sentence rate averages each pair's.
- METEOR: NLTK's `meteor_score` with its exact and Porter-stem matching stages. NLTK's third
  stage, WordNet synonyms, needs a corpus download that nothing here makes at run time, so it
  is left out: scores equal NLTK's given a WordNet with no synonyms, and are at most the full
  METEOR. The corpus score pools matches, lengths and chunks over all pairs (METEOR's
  system-level score); the sentence score averages NLTK's per-pair scores.
- BERTScore: the `bert-score` package's definition, computed with one of our encoders in
  Keras: contextual embeddings of both texts, cosine similarity, each token greedily matched
  to its most similar token of the other text; precision averages over the hypothesis tokens,
  recall over the reference tokens (weighted by idf when asked), F1 their harmonic mean.
  Special tokens (`[CLS]`, `[SEP]`) weigh 0, as in `bert-score`. The corpus score is the
  mean of the sentence scores, as `bert-score` reports it. The embeddings are those of the
  encoder's first `num_layers` blocks (`bert-score`'s `num_layers`: it drops the blocks past
  it); `bert-score` picks that number per checkpoint, by its published table, of which
  `BERT_SCORE_LAYERS` holds the families this library loads.
"""

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import keras
import numpy as np

from keras_attn.metrics.text import _check_pairs, _require

# `bert-score` 0.3's default `num_layers` for checkpoints of the families this library loads
# (its `model2layers` table, chosen by correlation with human judgments on WMT16); a name
# not here has no default there either (pass the number).
BERT_SCORE_LAYERS = {
    "bert-base-uncased": 9, "bert-large-uncased": 18, "bert-base-multilingual-cased": 9,
    "roberta-base": 10, "roberta-large": 17, "distilbert-base-uncased": 5,
    "distilroberta-base": 5, "xlm-roberta-base": 9, "xlm-roberta-large": 17,
}  # fmt: skip


def _check_texts(hypotheses: Sequence[str], references: Sequence[str]) -> None:
    _check_pairs("hypotheses", hypotheses, "references", references)
    if not hypotheses:
        raise ValueError("`hypotheses` must not be empty.")
    for name, texts in (("hypotheses", hypotheses), ("references", references)):
        bad = [i for i, t in enumerate(texts) if not isinstance(t, str)]
        if bad:
            raise ValueError(
                f"`{name}` must be strings. Received: {type(texts[bad[0]]).__name__} at {bad[0]}"
            )


def word_error_rate(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """Word error rate: (substitutions + deletions + insertions) / reference words.

    Returns:
        `{"corpus": …, "sentence": …}`: pooled over all pairs, and the mean of each pair's.
    Raises:
        ValueError: a reference without words (its rate is undefined).
    """
    _check_texts(hypotheses, references)
    if any(not r.split() for r in references):
        raise ValueError("Every reference must have a word (the rate divides by them).")
    jiwer = _require("jiwer")
    sentence = [jiwer.wer(r, h) for h, r in zip(hypotheses, references, strict=True)]
    return {
        "corpus": float(jiwer.wer(list(references), list(hypotheses))),
        "sentence": float(np.mean(sentence)),
    }


class _NoSynonyms:
    """A WordNet stand-in with no synsets: NLTK's METEOR then matches exact words and stems."""

    def synsets(self, *args: Any, **kwargs: Any) -> list[Any]:
        return []


def _chunks(matches: Sequence[tuple[int, int]]) -> int:
    """Runs of matches adjacent in both texts (METEOR's fragmentation)."""
    ordered = sorted(matches)
    return sum(
        1
        for i, (h, r) in enumerate(ordered)
        if i == 0 or (h, r) != (ordered[i - 1][0] + 1, ordered[i - 1][1] + 1)
    )


def meteor(
    hypotheses: Sequence[str],
    references: Sequence[str],
    alpha: float = 0.9,
    beta: float = 3.0,
    gamma: float = 0.5,
) -> dict[str, float]:
    """METEOR with exact and stem matching (see the module), on lower-cased whitespace words.

    Args:
        alpha, beta, gamma: METEOR's parameters (NLTK's defaults).
    Returns:
        `{"corpus": …, "sentence": …}`.
    """
    _check_texts(hypotheses, references)
    meteor_score = _require("nltk.translate.meteor_score")
    stemmer = _require("nltk.stem.porter").PorterStemmer()
    wordnet = _NoSynonyms()
    scores, matched, hyp_words, ref_words, chunks = [], 0, 0, 0, 0
    for hypothesis, reference in zip(hypotheses, references, strict=True):
        hyp, ref = hypothesis.lower().split(), reference.lower().split()
        scores.append(
            meteor_score.single_meteor_score(
                ref, hyp, stemmer=stemmer, wordnet=wordnet, alpha=alpha, beta=beta, gamma=gamma
            )
        )
        matches, _, _ = meteor_score.align_words(hyp, ref, stemmer=stemmer, wordnet=wordnet)
        matched, chunks = matched + len(matches), chunks + _chunks(matches)
        hyp_words, ref_words = hyp_words + len(hyp), ref_words + len(ref)
    corpus = 0.0
    if matched:
        precision, recall = matched / hyp_words, matched / ref_words
        fmean = precision * recall / (alpha * precision + (1 - alpha) * recall)
        corpus = fmean * (1 - gamma * (chunks / matched) ** beta)
    return {"corpus": corpus, "sentence": float(np.mean(scores))}


def idf_weights(references: Sequence[Sequence[int]]) -> dict[int, float]:
    """`bert-score`'s idf of each id: `log((M + 1) / (n + 1))`, `M` references, `n` of them
    holding the id; an id in none weighs `log(M + 1)`."""
    counts = Counter(token for ids in references for token in set(ids))
    total = len(references)
    weights = {token: math.log((total + 1) / (n + 1)) for token, n in counts.items()}
    return {**weights, -1: math.log(total + 1)}  # -1: the default


def bert_score(
    hypotheses: Sequence[str],
    references: Sequence[str],
    model: Any,
    idf: bool = False,
    batch_size: int = 32,
    preprocessor: Any = None,
    num_layers: int | None = None,
) -> dict[str, Any]:
    """BERTScore (see the module) with `model`: an `EncoderBackbone`, or a task holding one.

    Args:
        idf: bool. Weigh tokens by their idf over `references`.
        batch_size: int. Texts per forward pass.
        preprocessor: packs `[CLS] text [SEP]` (a `TextPreprocessor`, e.g.
            `keras_attn.models.heads.folder_preprocessor(folder, 128)`); defaults to the
            model's own (a task from `from_pretrained`).
        num_layers: int. The embeddings are the output of the encoder's first `num_layers`
            blocks (0: the embedding layer's), as `bert-score`'s argument of that name;
            `bert-score`'s default for a checkpoint is `BERT_SCORE_LAYERS[name]`. Defaults
            to every block (the encoder's `sequence_output`).

    Returns:
        `{"precision", "recall", "f1"}`, each `{"corpus": mean, "sentence": [per pair]}`.
    """
    _check_texts(hypotheses, references)
    preprocessor = preprocessor or getattr(model, "preprocessor", None)
    backbone = getattr(model, "backbone", model)
    if preprocessor is None or not hasattr(backbone, "padding_mask"):
        raise ValueError(
            "`model` must be an encoder (an EncoderBackbone or a task holding one), with a "
            "`preprocessor` given or its own. Received: "
            f"{type(model).__name__}, preprocessor={type(preprocessor).__name__}"
        )
    blocks = len(backbone.encoder_blocks)
    if num_layers is not None and (
        isinstance(num_layers, bool) or not isinstance(num_layers, int)
        or not 0 <= num_layers <= blocks
    ):  # fmt: skip
        raise ValueError(
            f"`num_layers` must be an integer in [0, {blocks}] (the encoder's blocks). "
            f"Received: num_layers={num_layers!r}"
        )
    special = [preprocessor.packer.start_value, preprocessor.packer.end_value]

    def embed(texts: Sequence[str]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Ids and unit embeddings of each text's real tokens (special ones included)."""
        out = []
        for start in range(0, len(texts), batch_size):
            features = preprocessor(list(texts[start : start + batch_size]))
            inputs = {name: np.asarray(features[name]) for name in backbone.input}
            hidden = keras.ops.convert_to_numpy(
                _hidden_states(backbone, inputs, num_layers)
            ).astype("float64")
            real = np.asarray(features["padding_mask"]).astype(bool)
            for ids, vectors, keep in zip(inputs["token_ids"], hidden, real, strict=True):
                norms = np.linalg.norm(vectors[keep], axis=-1, keepdims=True)
                out.append((ids[keep], vectors[keep] / np.maximum(norms, 1e-12)))
        return out

    hyp, ref = embed(hypotheses), embed(references)
    weights = idf_weights([ids.tolist() for ids, _ in ref]) if idf else None

    def weigh(ids: np.ndarray) -> np.ndarray:
        """Each token's weight: its idf (or 1), and 0 for `[CLS]` and `[SEP]`."""
        if weights is None:
            values = np.ones(len(ids))
        else:
            values = np.asarray([weights.get(int(t), weights[-1]) for t in ids])
        return np.where(np.isin(ids, [s for s in special if s is not None]), 0.0, values)

    scores: dict[str, list[float]] = {"precision": [], "recall": [], "f1": []}
    for (hyp_ids, hyp_vec), (ref_ids, ref_vec) in zip(hyp, ref, strict=True):
        hw, rw = weigh(hyp_ids), weigh(ref_ids)
        if not hw.sum() or not rw.sum():  # an empty text: nothing to match
            p = r = 0.0
        else:
            similarity = hyp_vec @ ref_vec.T
            p = float((similarity.max(axis=1) * hw).sum() / hw.sum())
            r = float((similarity.max(axis=0) * rw).sum() / rw.sum())
        f = 2 * p * r / (p + r) if p + r else 0.0
        for name, value in (("precision", p), ("recall", r), ("f1", f)):
            scores[name].append(value)
    return {
        name: {"corpus": float(np.mean(values)), "sentence": values}
        for name, values in scores.items()
    }


def _hidden_states(backbone: Any, inputs: dict[str, np.ndarray], num_layers: int | None) -> Any:
    """The output of `backbone`'s first `num_layers` blocks (None: its `sequence_output`),
    through a pre-norm encoder's final norm as well: the blocks past `num_layers` dropped,
    as `bert-score` drops them."""
    if num_layers is None:
        return backbone(inputs, training=False)["sequence_output"]
    tensors = {key: keras.ops.convert_to_tensor(value) for key, value in inputs.items()}
    segments = (tensors["segment_ids"],) if "segment_ids" in tensors else ()
    x = backbone.embeddings(tensors["token_ids"], *segments, start_index=backbone.position_offset)
    mask = backbone.padding_mask(tensors)
    for block in backbone.encoder_blocks[:num_layers]:
        x = block(x, padding_mask=mask)
    return x if backbone.final_norm is None else backbone.final_norm(x)
