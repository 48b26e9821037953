"""A task, ready to score any variant of one model: what `eval` and `tune` share."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from ..bench.variants import BuildContext, build, parse_variants
from ..quant.record import record_of
from ..runtime.shapes import buckets_up_to, repeat_rows


@dataclass
class Task:
    """name: task name; model: the FP32 model; calibration: batches never scored;
    metrics: metric names, the first one is what a loss budget applies to;
    score(model, label) -> {metric: value (percent)}; info: task facts for reports;
    batch_size, max_length: the largest batch shape score() feeds a model."""

    name: str
    model: nn.Module
    calibration: list[dict[str, Any]]
    metrics: tuple[str, ...]
    n_scored: int
    score: Callable[[Any, str], dict[str, float]]
    info: dict[str, Any] = field(default_factory=dict)
    batch_size: int = 16  # what score() feeds the model: compiled variants are built for it
    max_length: int = 128


def score_variants(
    t: Task,
    variants: str | tuple[str, ...],
    alpha: float | str | None = None,
    progress: bool = True,
    workdir: str | Path | None = None,
) -> dict[str, dict[str, float]]:
    """Build each variant of the task's model (variants.py) and score it: the one evaluate
    loop of `eval`, the probe and `tune`. Compiled and packaged variants run at the task's
    batch size, padded to length buckets up to its longest input."""
    parsed = parse_variants(variants)
    example = t.calibration[0] if t.calibration else None
    ctx = BuildContext(
        calibration=t.calibration,
        alpha=alpha,
        example_inputs=repeat_rows(example, t.batch_size) if example is not None else None,
        buckets=buckets_up_to(t.max_length),
        workdir=workdir,
        progress=progress,
    )
    model, score = t.model, t.score
    results = {}
    for v in parsed:
        name = v.name
        t0 = time.perf_counter()
        variant = build(v, model, ctx)
        built = time.perf_counter() - t0
        t0 = time.perf_counter()
        metrics = score(variant, name)
        results[name] = {
            **metrics,
            "build_seconds": built,
            "eval_seconds": time.perf_counter() - t0,
        }
        record = record_of(variant)
        if record and record.alphas:  # the alpha used per linear (searched when alpha="auto")
            results[name]["alpha_min"] = min(record.alphas)
            results[name]["alpha_max"] = max(record.alphas)
    return results
