"""`squant tune`: the fastest INT8 configuration whose accuracy loss fits a budget.

1. Score FP32 on the task (the reference).
2. Try candidates in speed order: static then dynamic, each with its defaults (static: per-layer
   auto alpha; dynamic: alpha 0 with float outlier channels at three GEMMs) and a global alpha
   grid; then (outlier_escalation) each mode with float outlier channels at every GEMM, alpha
   auto and 0 (slower: 0.85-0.93x, the most robust on unusual inputs; docs/quantization.md,
   "Static INT8 that holds on unusual inputs"); the first within budget wins.
3. Still over budget: rank the quantized linears by measured sensitivity (the output error
   when only that linear is int8, on the calibration batches) and fall back the most
   sensitive ones to float (BF16 under squant.compile) one at a time, re-scoring each time,
   until the budget holds; the speed cost of each fallback is measured.
The chosen model is saved with squant.save; the report lists everything tried.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from ..bench.report import format_table
from ..checkpoint.quantize_api import quantize
from ..errors import SquantError
from ..quant.config import MODES, SITE_KINDS, SmoothQuantConfig
from ..quant.qlinear import QuantLinear
from ..quant.quantize import smooth
from ..quant.record import record_of
from ..runtime.outputs import first_tensor
from .metrics import relative_loss
from .task import Task


@dataclass(frozen=True)
class TuneConfig:
    """max_loss: allowed relative loss of the primary metric vs FP32, in percent (0.5 = 0.5%).
    alphas: tried after each mode's defaults; modes: in the order tried (static is faster);
    max_fallback: at most this many linears go back to float; metric: the one the budget
    applies to (default: the task's first); outlier_escalation: try outlier channels at
    every GEMM before falling back linears to float."""

    max_loss: float = 0.5
    metric: str | None = None
    modes: tuple[str, ...] = MODES
    alphas: tuple[float | str, ...] = ("auto", 0.5, 0.75)
    max_fallback: int = 12
    outlier_escalation: bool = True

    def __post_init__(self) -> None:
        if not 0.0 <= self.max_loss < 100.0:
            raise SquantError(f"max loss must be a percentage in [0, 100), got {self.max_loss}")
        if self.max_fallback < 0:
            raise SquantError("max_fallback must be >= 0")


def _token_errors(out: torch.Tensor, ref: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Relative L2 error per real token (per row for outputs without a sequence axis)."""
    err = (out - ref).norm(dim=-1) / ref.norm(dim=-1).clamp(min=1e-12)
    if mask is not None and err.shape == mask.shape:
        return err[mask.bool()]
    return err.flatten()


@torch.no_grad()
def sensitivity(
    model: nn.Module, qmodel: nn.Module, calibration: list[dict[str, Any]]
) -> dict[str, float]:
    """Per quantized linear: the median relative error over real tokens of the model's output
    when only that linear is int8 (median: a few tokens that flip are not what makes a layer
    fragile; a layer that hurts every token is).

    Built on the smoothed float model (exactly FP32) with one of qmodel's int8 linears swapped
    in at a time; its fused activation (if any) is kept out, since the float model still runs
    the activation module itself."""
    record = record_of(qmodel)
    if record is None:
        raise SquantError("sensitivity() needs a model returned by squant.quantize()")
    info = record.modules
    alphas = {name: m.alpha for name, m in info.items() if m.alpha is not None}
    outliers = {
        name: q.outlier_index
        for name, q in qmodel.named_modules()
        if isinstance(q, QuantLinear) and q.outlier_index is not None
    }
    base = smooth(model, calibration, alphas, exclude=[], outliers=outliers, progress=False)
    refs = [first_tensor(model(**b)).float() for b in calibration]
    errors = {}
    for name in info:
        original = base.get_submodule(name)
        q = copy.deepcopy(qmodel.get_submodule(name))
        if not isinstance(q, QuantLinear):
            raise SquantError(f"{name} is recorded as quantized but is a {type(q).__name__}")
        q.activation = "none"
        base.set_submodule(name, q)
        token_errors = [
            _token_errors(first_tensor(base(**b)).float(), r, b.get("attention_mask"))
            for b, r in zip(calibration, refs, strict=True)
        ]
        base.set_submodule(name, original)
        errors[name] = float(torch.cat(token_errors).median())
    return errors


@dataclass(frozen=True)
class Attempt:
    """One candidate configuration and its scores (every metric of the task)."""

    config: SmoothQuantConfig
    scores: dict[str, float]
    loss_percent: float
    within_budget: bool
    seconds: float


@dataclass(frozen=True)
class Fallback:
    """One linear sent back to float, with the loss after it (and its speed cost if timed)."""

    fell_back: str
    sensitivity: float
    loss_percent: float
    ms: float | None = None
    slowdown_vs_full_int8: float | None = None


@dataclass
class TuneResult:
    """The chosen model and everything tried on the way (to_dict(): the JSON report)."""

    model: nn.Module
    metric: str
    fp32: float
    chosen: SmoothQuantConfig
    within_budget: bool
    tried: list[Attempt]
    fallbacks: list[Fallback]
    sensitivity: dict[str, float] | None
    config: TuneConfig

    def to_dict(self) -> dict[str, Any]:
        return {
            "budget_percent": self.config.max_loss,
            "metric": self.metric,
            "fp32": self.fp32,
            "chosen": self.chosen.to_dict(),
            "within_budget": self.within_budget,
            "tried": [
                {
                    "config": t.config.to_dict(),
                    **t.scores,
                    "loss_percent": t.loss_percent,
                    "within_budget": t.within_budget,
                    "seconds": t.seconds,
                }
                for t in self.tried
            ],
            "fallbacks": [
                {k: v for k, v in asdict(f).items() if v is not None} for f in self.fallbacks
            ],
            "sensitivity": self.sensitivity,
            "tune_config": asdict(self.config),
        }

    def lines(self) -> list[str]:
        """The report as a person reads it: every candidate, every fallback, the verdict."""
        m = self.metric
        others = [x for x in (self.tried[0].scores if self.tried else {}) if x != m]
        rows = [
            [
                t.config.mode,
                t.config.alpha,
                len(t.config.exclude),
                f"{t.scores[m]:.5f}",
                *(f"{t.scores[x]:.5f}" for x in others),
                f"{t.loss_percent:+.3f}%",
                "yes" if t.within_budget else "no",
            ]
            for t in self.tried
        ]
        out = [f"FP32 {m}: {self.fp32:.5f}; budget {self.config.max_loss}% relative loss"]
        out.append(
            format_table(["mode", "alpha", "float linears", m, *others, "loss", "within"], rows)
        )
        for f in self.fallbacks:
            speed = f" {f.ms:.1f} ms ({f.slowdown_vs_full_int8:.2f}x full INT8)" if f.ms else ""
            out.append(
                f"fell back {f.fell_back} (sensitivity {f.sensitivity:.4f}): "
                f"loss {f.loss_percent:+.3f}%{speed}"
            )
        verdict = "within budget" if self.within_budget else "OVER budget (best found kept)"
        out.append(
            f"chosen: {self.chosen.mode}, alpha {self.chosen.alpha}, "
            f"{len(self.chosen.exclude)} linear(s) in float ({verdict})"
        )
        return out


def tune(
    task: Task,
    config: TuneConfig | None = None,
    measure_speed: Callable[[nn.Module], float] | None = None,
) -> TuneResult:
    """Search as described in the module docstring.

    measure_speed: optional callable(model) -> ms per forward, for the fallback speed costs."""
    config = config or TuneConfig()
    metric = config.metric or task.metrics[0]
    if metric not in task.metrics:
        raise SquantError(f"metric {metric!r} is not one of this task's: {', '.join(task.metrics)}")
    fp32 = task.score(task.model, "fp32")[metric]
    tried: list[Attempt] = []

    def attempt(qconfig: SmoothQuantConfig, label: str) -> tuple[nn.Module, float]:
        t0 = time.perf_counter()
        q = quantize(task.model, qconfig, task.calibration, progress=False)
        scores = task.score(q, label)  # every metric is kept in the report
        loss = relative_loss(scores[metric], fp32)
        within = loss <= config.max_loss
        tried.append(Attempt(qconfig, scores, loss, within, time.perf_counter() - t0))
        return q, loss

    def result(q: nn.Module, qconfig: SmoothQuantConfig, **rest: Any) -> TuneResult:
        return TuneResult(q, metric, fp32, qconfig, tried=tried, config=config, **rest)

    candidates: list[tuple[SmoothQuantConfig, str]] = []
    for mode in config.modes:  # each mode's defaults first, then its alpha grid
        defaults = SmoothQuantConfig(mode=mode)  # type: ignore[arg-type]
        candidates.append((defaults, f"{mode} defaults (alpha={defaults.alpha})"))
        candidates += [
            (SmoothQuantConfig(mode=mode, alpha=alpha), f"{mode} alpha={alpha}")  # type: ignore[arg-type]
            for alpha in config.alphas
        ]
    if config.outlier_escalation:
        candidates += [
            (
                SmoothQuantConfig(mode=mode, alpha=alpha, outlier_sites=SITE_KINDS),  # type: ignore[arg-type]
                f"{mode} alpha={alpha} outliers at every GEMM",
            )
            for mode in config.modes
            for alpha in ("auto", 0.0)
        ]
    unique: dict[SmoothQuantConfig, str] = {}  # a grid alpha may equal a mode's defaults
    for qconfig, label in candidates:
        unique.setdefault(qconfig, label)
    best: tuple[nn.Module, float, SmoothQuantConfig] | None = None
    for qconfig, label in unique.items():
        q, loss = attempt(qconfig, label)
        if best is None or loss < best[1]:
            best = (q, loss, qconfig)
        if loss <= config.max_loss:
            return result(q, qconfig, within_budget=True, fallbacks=[], sensitivity=None)
    if best is None:
        raise SquantError("tune needs at least one mode and one alpha to try")

    # over budget everywhere: fall back the most sensitive linears of the best candidate
    q, loss, qconfig = best
    ranking = sensitivity(task.model, q, task.calibration)
    order = sorted(ranking, key=ranking.__getitem__, reverse=True)
    fallbacks: list[Fallback] = []
    base_ms = measure_speed(q) if measure_speed else None
    excluded: list[str] = []
    for name in order[: config.max_fallback]:
        excluded.append(name)
        qconfig = SmoothQuantConfig(**{**qconfig.to_dict(), "exclude": tuple(excluded)})
        q, loss = attempt(qconfig, f"fallback {len(excluded)}")
        ms = measure_speed(q) if measure_speed else None
        slowdown = ms / base_ms if ms is not None and base_ms else None
        fallbacks.append(Fallback(name, ranking[name], loss, ms, slowdown))
        if loss <= config.max_loss:
            break
    return result(
        q,
        qconfig,
        within_budget=loss <= config.max_loss,
        fallbacks=fallbacks,
        sensitivity=ranking,
    )
