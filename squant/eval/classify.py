"""Sentence (pair) classification data and predictions, for sequence-classification heads.

Data: JSONL (SNLI/MultiNLI: sentence1, sentence2, gold_label; or premise/hypothesis/label,
text/sentence/label) or TSV with a header (GLUE: MNLI's sentence1, sentence2, gold_label;
SST-2's sentence, label; ...). Labels are names or integer ids; names are mapped with the
checkpoint's own config.id2label.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from ..errors import SquantError
from ..files import iter_jsonl
from ..quant.mappings import model_inputs
from . import hf_data

FIRST = ("sentence1", "premise", "question", "question1", "text_a", "sentence", "text")
SECOND = ("sentence2", "hypothesis", "sentence", "question2", "text_b")
LABEL = ("gold_label", "label", "labels")


@dataclass(frozen=True)
class LabelledText:
    text: str
    pair: str | None
    label: str  # as written in the data (a name or an integer id)


def _pick(record: dict[str, Any], keys: tuple[str, ...], exclude: str | None = None) -> str | None:
    for k in keys:
        if k != exclude and isinstance(record.get(k), str | int) and str(record[k]).strip() != "":
            return k
    return None


def _records(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    if path.suffix == ".jsonl":
        yield from iter_jsonl(path)
    elif path.suffix in (".tsv", ".txt"):
        with path.open(encoding="utf-8", newline="") as f:
            reader = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
            yield from enumerate(reader, 2)
    else:
        raise SquantError(f"{path}: expected .jsonl or .tsv data")


def read_labelled(
    path: str | Path, limit: int | None = None, pairs: bool | None = None, task: str = "glue"
) -> list[LabelledText]:
    """Labelled texts in file order. pairs: True = every row must be a pair (NLI), None = all
    rows like the first; a row of the other kind is an error, never silently scored alone.
    path may also name a Hugging Face dataset (hf_data.py; its split defaults by task)."""
    if hf_data.is_dataset(path):
        return _parse_labelled(hf_data.rows(path, task), str(path), limit, pairs)
    path = Path(path)
    if not path.is_file():
        raise SquantError(f"data file {path} does not exist")
    records = ((f"{path}:{n}", rec) for n, rec in _records(path))
    try:
        return _parse_labelled(records, str(path), limit, pairs)
    except UnicodeDecodeError as e:
        raise SquantError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    except csv.Error as e:
        raise SquantError(f"{path} is not a readable TSV file ({e})") from None


def _parse_labelled(
    records: Iterable[tuple[str, dict[str, Any]]],
    source: str,
    limit: int | None,
    pairs: bool | None,
) -> list[LabelledText]:
    items: list[LabelledText] = []
    for where, rec in records:
        first = _pick(rec, FIRST)
        label = _pick(rec, LABEL)
        if first is None or label is None:
            wanted = f"a text field ({', '.join(FIRST)}) and a label ({', '.join(LABEL)})"
            raise SquantError(f"{where}: need {wanted}")
        second = _pick(rec, SECOND, exclude=first)
        if pairs is None:
            pairs = second is not None
        if pairs != (second is not None):
            kind = "a sentence pair" if pairs else "a single text (as the first row)"
            raise SquantError(f"{where}: expected {kind}; rows must not mix pairs and single texts")
        if str(rec[label]).strip() == "-":  # SNLI/MNLI: no annotator consensus
            continue
        items.append(
            LabelledText(
                str(rec[first]), str(rec[second]) if second else None, str(rec[label]).strip()
            )
        )
        if limit is not None and len(items) >= limit:
            break
    if not items:
        raise SquantError(f"{source} holds no labelled examples")
    return items


def label_ids(items: list[LabelledText], config: Any) -> list[int]:
    """Map the data's labels to the checkpoint's class ids (by name, or as integer ids)."""
    id2label = {int(k): str(v).lower() for k, v in (config.id2label or {}).items()}
    by_name = {v: k for k, v in id2label.items()}
    out = []
    for it in items:
        lab = it.label.lower()
        if lab in by_name:
            out.append(by_name[lab])
        elif lab.lstrip("-").isdigit() and int(lab) in id2label:
            out.append(int(lab))
        else:
            raise SquantError(
                f"label {it.label!r} is not one of the checkpoint's labels {sorted(by_name)} "
                "(config.id2label) nor a class id"
            )
    return out


@torch.no_grad()
def predict_labels(
    model: nn.Module,
    tokenizer: Any,
    items: list[LabelledText],
    batch_size: int = 32,
    max_length: int = 128,
    desc: str = "classify",
    progress: bool = True,
) -> list[int]:
    preds: list[int] = []
    for i in tqdm(range(0, len(items), batch_size), desc=desc, disable=not progress, leave=False):
        chunk = items[i : i + batch_size]
        texts = [it.text for it in chunk]
        pairs = [it.pair for it in chunk]
        kw = {"padding": True, "truncation": True, "max_length": max_length, "return_tensors": "pt"}
        enc = (
            tokenizer(texts, pairs, **kw)
            if all(p is not None for p in pairs)
            else tokenizer(texts, **kw)
        )
        preds.extend(model(**model_inputs(model, enc)).logits.argmax(-1).tolist())
    return preds
