"""Readable tables for results (JSON is written alongside by the callers)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain-text table, numbers right-aligned; floats keep the precision they were given."""
    cells = [[str(h) for h in headers], *[[_cell(v) for v in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    numeric = [all(_is_number(row[i]) for row in rows) for i in range(len(headers))]

    def line(r: list[str]) -> str:
        return "  ".join(
            c.rjust(w) if num else c.ljust(w) for c, w, num in zip(r, widths, numeric, strict=True)
        )

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(cells[0]), sep, *(line(r) for r in cells[1:])])


def _cell(v: Any) -> str:
    return "-" if v is None else str(v)


def _is_number(v: Any) -> bool:
    return v is None or isinstance(v, int | float) or (isinstance(v, str) and _parses(v))


def _parses(s: str) -> bool:
    try:
        float(s.rstrip("x%"))
    except ValueError:
        return False
    return True
