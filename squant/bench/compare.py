"""`squant bench` as a library call: build every variant of one model, run each on the same
instance layout, and compare throughput and latency (ratios against the float baselines)."""

from __future__ import annotations

import platform
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from tqdm.auto import tqdm

from ..hardware import cpu_features
from ..runtime.placement import Placement
from ..runtime.shapes import fitted_shape
from . import runner
from .configs import random_calibration, random_inputs
from .report import format_table
from .variants import BuildContext, build, parse_variants

HEADERS = ["variant", "N x C", "seq/s (all)", "p50 ms", "p90 ms", "p99 ms", "vs FP32", "vs BF16"]


@dataclass
class BenchReport:
    model: str
    weights: str  # "random weights (published config)" or "checkpoint weights"
    batch: int
    seq: int
    placement: Placement
    duration_s: float
    results: dict[str, dict[str, Any]]  # variant -> runner.run's record
    memory_one_instance: dict[str, Any] = field(default_factory=dict)

    def throughput(self, name: str) -> float:
        return float(self.results[name]["sequences_per_s"])

    def _baseline(self, precision: str) -> float | None:
        # the compiled float model when both it and the eager one ran
        for n in (f"{precision}-compiled", precision):
            if n in self.results:
                return self.throughput(n)
        return None

    def rows(self) -> list[list[Any]]:
        fp32, bf16 = self._baseline("fp32"), self._baseline("bf16")
        rows = []
        for name, r in self.results.items():
            worst = max((lat for lat in r["latency"] if lat), key=lambda lat: lat["median_ms"])
            tput = self.throughput(name)
            rows.append(
                [
                    name,
                    f"{r['instances']}x{r['cores_per_instance']}",
                    f"{tput:.1f}",
                    f"{worst['median_ms']:.1f}",
                    f"{worst['p90_ms']:.1f}",
                    f"{worst['p99_ms']:.1f}",
                    f"{tput / fp32:.2f}x" if fp32 else None,
                    f"{tput / bf16:.2f}x" if bf16 else None,
                ]
            )
        return rows

    def lines(self) -> list[str]:
        p = self.placement
        out = [
            f"{self.model} ({self.weights}), batch {self.batch}, seq {self.seq}; "
            f"{p.instances} instance(s) x {p.cores_per_instance} core(s), cores {p.cores}",
            format_table(HEADERS, self.rows()),
        ]
        last_name = list(self.results)[-1]
        last = self.results[last_name]["memory"]
        if self.memory_one_instance and last:
            one = self.memory_one_instance.get("pss_kib", 0) / 1024
            out.append(
                f"memory of the process ({last_name}): 1 instance {one:.0f} MiB PSS, "
                f"{p.instances} instances {last.get('pss_kib', 0) / 1024:.0f} MiB PSS "
                "(one shared model)"
            )
        return out

    def record(self) -> dict[str, Any]:
        return {
            "benchmark": "squant bench",
            "model": self.model,
            "weights": self.weights,
            "batch": self.batch,
            "seq": self.seq,
            "instances": self.placement.instances,
            "cores_per_instance": self.placement.cores_per_instance,
            "duration_s": self.duration_s,
            "variants": list(self.results),
            "results": self.results,
            "memory_one_instance": self.memory_one_instance,
            "versions": {"torch": torch.__version__, "python": platform.python_version()},
            "hardware": cpu_features().to_dict(),
        }


def bench_variants(
    model: Any,
    name: str,
    variants: Sequence[str] | str,
    placement: Placement,
    batch: int = 1,
    seq: int = 256,
    duration_s: float = 10.0,
    weights: str = "checkpoint weights",
) -> BenchReport:
    """Build each variant (random tokens and calibration: speed does not depend on the
    values), then run it on every instance of `placement` for duration_s; with several
    instances, the last variant is also run on one to show the memory they share."""
    names = [v.name for v in parse_variants(variants)]
    batch, seq = fitted_shape(model, batch, seq)
    inputs = random_inputs(model, batch, seq)
    calibration = random_calibration(model, seq=min(seq, 128))
    report = BenchReport(name, weights, batch, seq, placement, duration_s, {})
    for variant in tqdm(names, desc="variants"):
        torch._dynamo.reset()
        context = BuildContext(
            calibration, example_inputs=inputs, instances=placement.instances, progress=False
        )
        compiled = build(variant, model, context)

        def forward(c: Any = compiled) -> Any:
            return c(**inputs)

        if variant == names[-1] and placement.instances > 1:
            single = Placement(1, placement.cores_per_instance, placement.cores[:1])
            one = runner.run(forward, single, duration_s=min(duration_s, 3.0))
            report.memory_one_instance = one["memory"]
        report.results[variant] = runner.run(forward, placement, duration_s=duration_s, batch=batch)
    return report
