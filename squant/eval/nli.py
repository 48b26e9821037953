"""NLI data in the published SNLI / MultiNLI JSONL format (sentence1, sentence2, gold_label)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import SquantError

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


def read_nli_jsonl(path: str | Path, limit: int | None = None) -> Pairs:
    """Pairs with a gold label (items whose gold_label is '-', no consensus, are skipped)."""
    path = Path(path)
    if not path.is_file():
        raise SquantError(f"NLI data file {path} does not exist")
    prem, hyp, lab = [], [], []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                label = rec["gold_label"]
                s1, s2 = rec["sentence1"], rec["sentence2"]
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise SquantError(f"{path}:{n}: not an NLI record ({e})") from None
            if label not in NLI_LABELS:
                continue
            prem.append(s1)
            hyp.append(s2)
            lab.append(NLI_LABELS.index(label))
            if limit is not None and len(lab) >= limit:
                break
    if not lab:
        raise SquantError(f"{path} holds no labelled NLI pairs")
    return Pairs(prem, hyp, lab)
