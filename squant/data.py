"""Calibration text: read sentences (or sentence pairs) from a file and tokenize them.

Accepted files:
  .txt / .tsv  one text per line; a tab separates the two texts of a pair
  .jsonl       one JSON object per line with a text field ("text", "sentence", ...) or a pair
               ("sentence1"/"sentence2", "premise"/"hypothesis", "question"/"context", ...),
               or a bare JSON string
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from .errors import SquantError
from .files import iter_jsonl

Text = str | tuple[str, str]

PAIR_FIELDS = (
    ("sentence1", "sentence2"),
    ("premise", "hypothesis"),
    ("question", "context"),
    ("text_a", "text_b"),
    ("question1", "question2"),
)
SINGLE_FIELDS = ("text", "sentence", "content", "document", "query")


def text_from_record(record: Any, where: str) -> Text:
    if isinstance(record, str):
        return record
    if not isinstance(record, dict):
        raise SquantError(f"{where}: expected a JSON object or string, got {type(record).__name__}")
    for a, b in PAIR_FIELDS:
        if isinstance(record.get(a), str) and isinstance(record.get(b), str):
            return (record[a], record[b])
    for key in SINGLE_FIELDS + tuple(a for a, _ in PAIR_FIELDS):
        if isinstance(record.get(key), str):
            return record[key]
    fields = ", ".join(SINGLE_FIELDS) + "; pairs " + ", ".join("/".join(p) for p in PAIR_FIELDS)
    raise SquantError(f"{where}: no text field found (looked for {fields})")


# a file squant would read wrongly as text lines: refused, with the formats it does read
_NOT_TEXT_SUFFIXES = (".json", ".parquet", ".csv", ".gz", ".zip", ".arrow", ".safetensors")


def _file_texts(path: Path) -> Iterator[Text]:
    if path.suffix.lower() in _NOT_TEXT_SUFFIXES:
        raise SquantError(
            f"{path}: {path.suffix} is not a calibration format; use .jsonl (one JSON object "
            "per line), or .txt/.tsv (one text per line, a tab between a pair)"
        )
    if path.suffix == ".jsonl":
        for n, record in iter_jsonl(path, objects_only=False):
            yield text_from_record(record, f"{path}:{n}")
        return
    with path.open(encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if line.strip():
                yield tuple(line.split("\t", 1)) if "\t" in line else line  # type: ignore[misc]


def read_texts(path: str | Path, limit: int | None = None) -> list[Text]:
    """Non-empty texts or pairs from a calibration file, in file order."""
    path = Path(path)
    if not path.is_file():
        raise SquantError(f"calibration file {path} does not exist")
    texts: list[Text] = []
    try:
        for text in _file_texts(path):
            if isinstance(text, str) and not text.strip():
                continue
            texts.append(text)
            if limit is not None and len(texts) >= limit:
                break
    except UnicodeDecodeError as e:
        raise SquantError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    if not texts:
        raise SquantError(f"calibration file {path} holds no text")
    return texts


def coverage_texts(texts: Sequence[Text]) -> tuple[list[Text], list[str]]:
    """Inputs unlike ordinary calibration sentences that serving meets every day: an empty
    text (special tokens only) and texts cut to 1-5 words; and the texts packed end to end
    into long documents. Static INT8 calibrated on short sentences alone lost up to 0.3 of
    embedding cosine on such inputs (real MiniLM; benchmarks/stress.py)."""

    def cut(t: str, n: int) -> str:
        return " ".join(t.split()[:n])

    firsts = [t[0] if isinstance(t, tuple) else t for t in texts]
    lengths = (0, 1, 1, 2, 3, 5)
    sources = itertools.cycle(texts)  # as many texts as lengths, reusing a short list
    short: list[Text] = [
        (cut(t[0], n), cut(t[1], n)) if isinstance(t, tuple) else cut(t, n)
        for t, n in zip(sources, lengths, strict=False)
    ]
    packed = " ".join(firsts)
    return short, [packed, " ".join(reversed(firsts))]


def tokenize(
    tokenizer: Any,
    texts: Sequence[Text],
    batch_size: int = 8,
    max_length: int = 128,
    coverage_length: int | None = None,
) -> list[dict[str, Any]]:
    """Batches of tokenizer outputs (padded per batch, truncated to max_length).

    coverage_length: also add the inputs of coverage_texts(): a batch of very short and empty
    inputs, and two long documents packed from the texts, truncated at coverage_length (the
    longest sequence serving will see), so calibration sees every length it will meet."""
    if batch_size < 1:
        raise SquantError(f"batch size must be >= 1, got {batch_size}")
    if max_length < 2:
        raise SquantError(f"max length must be >= 2, got {max_length}")
    pairs = [isinstance(t, tuple) for t in texts]
    if len(set(pairs)) > 1:
        first_odd = pairs.index(not pairs[0])
        raise SquantError(
            f"calibration texts mix single sentences and pairs (text {first_odd + 1} differs "
            "from the first); give one kind"
        )
    batches = []
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    for i in range(0, len(texts), batch_size):
        chunk = texts[i : i + batch_size]
        kwargs = {"padding": True, "truncation": True, "max_length": max_length}
        if isinstance(chunk[0], tuple):
            first, second = zip(*chunk, strict=True)
            enc = tokenizer(list(first), list(second), return_tensors="pt", **kwargs)
        else:
            enc = tokenizer(list(chunk), return_tensors="pt", **kwargs)
        batches.append(dict(enc))
    if coverage_length is not None and texts:
        short, docs = coverage_texts(texts)
        kwargs = {"padding": True, "truncation": True, "max_length": max_length}
        if isinstance(short[0], tuple):
            first, second = zip(*short, strict=True)
            batches.append(
                dict(tokenizer(list(first), list(second), return_tensors="pt", **kwargs))
            )
        else:
            batches.append(dict(tokenizer(short, return_tensors="pt", **kwargs)))
        for doc in docs:
            enc = tokenizer([doc], truncation=True, max_length=coverage_length, return_tensors="pt")
            batches.append(dict(enc))
    real = 0
    for b in batches:
        ids, mask = b["input_ids"], b.get("attention_mask")
        keep = mask.bool() if mask is not None else ids.new_ones(ids.shape, dtype=bool)
        for sid in special:
            keep &= ids != sid
        real += int(keep.sum())
    if real == 0:
        raise SquantError(
            "the calibration text tokenizes to nothing but special tokens; give real sentences"
        )
    return batches
