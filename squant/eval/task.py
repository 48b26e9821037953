"""A task, ready to score any variant of one model: what `eval` and `tune` share."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn


@dataclass
class Task:
    """name: task name; model: the FP32 model; calibration: batches never scored;
    metrics: metric names, the first one is what a loss budget applies to;
    score(model, label) -> {metric: value (percent)}; info: task facts for reports."""

    name: str
    model: nn.Module
    calibration: list[dict[str, Any]]
    metrics: tuple[str, ...]
    n_scored: int
    score: Callable[[Any, str], dict[str, float]]
    info: dict[str, Any] = field(default_factory=dict)
