"""Honest latency measurement: warm-up excluded, many repetitions, median and tail.

A stopwatch, not a benchmark: squant.compile (choosing kernels by measurement), tune, the
benchmarks and squant.bench all use it, so it lives below them all."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Latency:
    """Milliseconds per call over `n` timed calls."""

    n: int
    median_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    min_ms: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _percentile(sorted_values: list[float], q: float) -> float:
    if len(sorted_values) == 1:
        return sorted_values[0]
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def summarize(samples_s: list[float]) -> Latency:
    ms = sorted(s * 1e3 for s in samples_s)
    return Latency(
        n=len(ms),
        median_ms=_percentile(ms, 0.5),
        p90_ms=_percentile(ms, 0.9),
        p99_ms=_percentile(ms, 0.99),
        mean_ms=statistics.fmean(ms),
        min_ms=ms[0],
    )


def measure(
    fn: Callable[[], Any],
    warmup: int = 3,
    min_iters: int = 10,
    max_iters: int = 200,
    min_seconds: float = 2.0,
) -> Latency:
    """Time fn() after `warmup` untimed calls, until both min_iters and min_seconds are met."""
    for _ in range(warmup):
        fn()
    samples: list[float] = []
    start = time.perf_counter()
    while len(samples) < max_iters and (
        len(samples) < min_iters or time.perf_counter() - start < min_seconds
    ):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return summarize(samples)
