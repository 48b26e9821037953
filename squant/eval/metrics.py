"""Task metrics as pure functions (percent values), with the official SQuAD normalization."""

from __future__ import annotations

import collections
import re
import string
from collections.abc import Callable, Mapping, Sequence

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCT = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD's official normalization: lower case, drop punctuation and articles, squeeze spaces."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1(prediction: str, gold: str) -> float:
    """Token-overlap F1 after normalization; two empty answers agree (SQuAD v2 no-answer)."""
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    if not pred_tokens or not gold_tokens:
        return float(pred_tokens == gold_tokens)
    common = collections.Counter(pred_tokens) & collections.Counter(gold_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision = same / len(pred_tokens)
    recall = same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def best_over_golds(
    metric: Callable[[str, str], float], prediction: str, golds: Sequence[str]
) -> float:
    """Max of the metric over the gold answers; no gold answers means 'unanswerable'."""
    if not golds:
        golds = [""]
    return max(metric(prediction, g) for g in golds)


def squad_scores(
    predictions: Mapping[str, str], golds: Mapping[str, Sequence[str]]
) -> dict[str, float]:
    """{"exact_match", "f1"} in percent over every question in golds (missing = empty answer)."""
    if not golds:
        raise ValueError("no questions to score")
    em = f = 0.0
    for qid, answers in golds.items():
        pred = predictions.get(qid, "")
        em += best_over_golds(exact_match, pred, answers)
        f += best_over_golds(f1, pred, answers)
    return {"exact_match": 100.0 * em / len(golds), "f1": 100.0 * f / len(golds)}


def accuracy(predictions: Sequence[int], labels: Sequence[int]) -> float:
    """Percent of predictions equal to their label."""
    if len(predictions) != len(labels) or not labels:
        raise ValueError(
            f"need equal, non-empty sequences, got {len(predictions)} and {len(labels)}"
        )
    return 100.0 * sum(int(p == y) for p, y in zip(predictions, labels, strict=True)) / len(labels)


def relative_loss(value: float, reference: float) -> float:
    """(reference - value) / reference, in percent: the paper's "accuracy loss"."""
    return 100.0 * (reference - value) / reference if reference else 0.0
