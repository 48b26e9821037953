"""NLI pairs (SNLI / MultiNLI: sentence1, sentence2, gold_label) as the probe reads them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import SquantError
from .classify import read_labelled

NLI_LABELS = ("entailment", "neutral", "contradiction")


@dataclass(frozen=True)
class Pairs:
    premises: list[str]
    hypotheses: list[str]
    labels: list[int]  # index into NLI_LABELS

    def __len__(self) -> int:
        return len(self.labels)

    def slice(self, start: int, stop: int | None = None) -> Pairs:
        return Pairs(
            self.premises[start:stop], self.hypotheses[start:stop], self.labels[start:stop]
        )


def read_nli(path: str | Path, limit: int | None = None) -> Pairs:
    """Pairs with a gold label (items whose gold_label is '-', no consensus, are skipped).
    Read like every labelled file (classify.read_labelled): JSONL, TSV or a dataset."""
    items = read_labelled(path, pairs=True, task="snli")
    pairs = [it for it in items if it.label.lower() in NLI_LABELS][:limit]
    if not pairs:
        raise SquantError(f"{path} holds no pairs labelled {', '.join(NLI_LABELS)}")
    return Pairs(
        [it.text for it in pairs],
        [str(it.pair) for it in pairs],
        [NLI_LABELS.index(it.label.lower()) for it in pairs],
    )
