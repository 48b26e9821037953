"""Extractive QA in the SQuAD v1.1 / v2.0 JSON format: windowed inference and answer spans."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from ..errors import SquantError
from ..files import read_json
from ..quant.mappings import model_inputs
from . import hf_data


@dataclass(frozen=True)
class SquadExample:
    id: str
    question: str
    context: str
    answers: tuple[str, ...]  # empty: unanswerable (v2.0)


def read_squad(path: str | Path, limit: int | None = None) -> tuple[list[SquadExample], bool]:
    """Questions in file order, and whether the file is SQuAD v2 (has unanswerable ones).
    path may also name a Hugging Face dataset in its flat SQuAD layout (hf_data.py)."""
    if hf_data.is_dataset(path):
        return _from_flat_rows(hf_data.rows(path, "squad"), str(path), limit)
    path = Path(path)
    if not path.is_file():
        raise SquantError(f"SQuAD file {path} does not exist")
    try:
        data = read_json(path, "a SQuAD JSON file")["data"]
    except (KeyError, TypeError) as e:
        raise SquantError(f"{path} is not a SQuAD JSON file ({type(e).__name__}: {e})") from None
    qas = (
        (qa, para["context"])
        for article in data
        for para in article["paragraphs"]
        for qa in para["qas"]
    )
    return _examples(qas, str(path), limit)


def _from_flat_rows(
    rows: Iterable[tuple[str, dict[str, Any]]], source: str, limit: int | None
) -> tuple[list[SquadExample], bool]:
    """The datasets layout: one row per question, answers as {"text": [...], ...}; a question
    with no answer text is unanswerable (SQuAD v2)."""

    def qas() -> Iterator[tuple[dict[str, Any], Any]]:
        for where, row in rows:
            answers = row.get("answers")
            if not isinstance(answers, dict) or not isinstance(answers.get("text"), list):
                raise SquantError(f"{where}: expected SQuAD rows with answers {{'text': [...]}}")
            texts = answers["text"]
            qa = {**row, "answers": [{"text": t} for t in texts], "is_impossible": not texts}
            yield qa, row.get("context")

    return _examples(qas(), source, limit)


def _examples(
    qas: Iterable[tuple[dict[str, Any], Any]], source: str, limit: int | None
) -> tuple[list[SquadExample], bool]:
    examples: list[SquadExample] = []
    seen: set[str] = set()
    v2 = False
    path = source
    try:
        for qa, context in qas:
            impossible = bool(qa.get("is_impossible", False))
            v2 |= impossible
            answers = () if impossible else tuple(a["text"] for a in qa["answers"])
            qid = str(qa["id"])
            if qid in seen:
                raise SquantError(
                    f"{path}: question id {qid!r} appears twice; scores are kept per id, "
                    "so every question needs its own"
                )
            seen.add(qid)
            if not isinstance(qa["question"], str) or not isinstance(context, str):
                raise SquantError(f"{path}: question {qid!r} has a non-text field")
            examples.append(SquadExample(qid, qa["question"], context, answers))
            if limit is not None and len(examples) >= limit:
                return examples, v2
    except (KeyError, TypeError) as e:
        raise SquantError(f"{path}: malformed SQuAD entry (missing {e})") from None
    if not examples:
        raise SquantError(f"{path} holds no questions")
    return examples, v2


def _best_span(
    start: Tensor,
    end: Tensor,
    offsets: Any,
    context_mask: Tensor,
    max_answer_length: int,
    n_best: int,
) -> tuple[float, int, int] | None:
    """(score, char_start, char_end) of the best valid span in one window, or None."""
    starts = torch.topk(start.masked_fill(~context_mask, -1e9), min(n_best, len(start))).indices
    ends = torch.topk(end.masked_fill(~context_mask, -1e9), min(n_best, len(end))).indices
    best = None
    for s in starts.tolist():
        for e in ends.tolist():
            if not (context_mask[s] and context_mask[e]) or e < s or e - s + 1 > max_answer_length:
                continue
            score = float(start[s] + end[e])
            if best is None or score > best[0]:
                best = (score, int(offsets[s][0]), int(offsets[e][1]))
    return best


@torch.no_grad()
def predict_squad(
    model: nn.Module,
    tokenizer: Any,
    examples: list[SquadExample],
    version_2: bool,
    max_length: int = 384,
    doc_stride: int = 128,
    max_answer_length: int = 30,
    n_best: int = 20,
    batch_size: int = 16,
    desc: str = "squad",
    progress: bool = True,
) -> dict[str, str]:
    """Answer text per question id ("" = no answer). Long contexts are split into windows
    overlapping by `doc_stride` tokens; the best span over all windows wins, and for v2.0 the
    answer is empty when the no-answer score (start = end = [CLS]) beats it."""
    if not getattr(tokenizer, "is_fast", False):
        raise SquantError("SQuAD evaluation needs a fast tokenizer (offset mappings)")
    best: dict[str, tuple[float, str]] = {}
    null: dict[str, float] = {}
    bar = tqdm(total=len(examples), desc=desc, disable=not progress, leave=False)
    for i in range(0, len(examples), batch_size):
        chunk = examples[i : i + batch_size]
        enc = tokenizer(
            [ex.question.lstrip() for ex in chunk],
            [ex.context for ex in chunk],
            truncation="only_second",
            max_length=max_length,
            stride=doc_stride,
            return_overflowing_tokens=True,
            return_offsets_mapping=True,
            padding=True,
            return_tensors="pt",
        )
        mapping = enc.pop("overflow_to_sample_mapping").tolist()
        offsets = enc.pop("offset_mapping")
        out = model(**model_inputs(model, enc))
        for f, ex_index in enumerate(mapping):
            ex = chunk[ex_index]
            seq_ids = enc.sequence_ids(f)
            context_mask = torch.tensor([sid == 1 for sid in seq_ids])
            start, end = out.start_logits[f].float(), out.end_logits[f].float()
            null_score = float(start[0] + end[0])
            null[ex.id] = min(null.get(ex.id, float("inf")), null_score)
            span = _best_span(start, end, offsets[f], context_mask, max_answer_length, n_best)
            if span is not None and (ex.id not in best or span[0] > best[ex.id][0]):
                best[ex.id] = (span[0], ex.context[span[1] : span[2]])
        bar.update(len(chunk))
    bar.close()
    answers = {}
    for ex in examples:
        score, text = best.get(ex.id, (float("-inf"), ""))
        if version_2 and null.get(ex.id, float("-inf")) > score:
            text = ""
        answers[ex.id] = text
    return answers
