"""`squant tune`: the fastest INT8 configuration whose accuracy loss fits a budget.

1. Score FP32 on the task (the reference).
2. Try candidates in speed order: static then dynamic, each with per-layer auto alpha and a
   global alpha grid; the first within budget wins.
3. Still over budget: rank the quantized linears by measured sensitivity (the output error
   when only that linear is int8, on the calibration batches) and fall back the most
   sensitive ones to float (BF16 under squant.compile) one at a time, re-scoring each time,
   until the budget holds; the speed cost of each fallback is measured.
The chosen model is saved with squant.save; the report lists everything tried.
"""

from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from .config import SmoothQuantConfig
from .errors import SquantError
from .eval.metrics import relative_loss
from .eval.task import Task
from .outputs import first_tensor
from .quantize import quantize, smooth
from .record import record_of


@dataclass(frozen=True)
class TuneConfig:
    """max_loss: allowed relative loss of the primary metric vs FP32, in percent (0.5 = 0.5%).
    alphas: candidates besides "auto"; modes: in the order tried (static is the faster);
    max_fallback: at most this many linears go back to float; metric: the one the budget
    applies to (default: the task's first)."""

    max_loss: float = 0.5
    metric: str | None = None
    modes: tuple[str, ...] = ("static", "dynamic")
    alphas: tuple[float | str, ...] = ("auto", 0.5, 0.75)
    max_fallback: int = 12

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
    base = smooth(model, calibration, alphas, exclude=[], progress=False)
    refs = [first_tensor(model(**b)).float() for b in calibration]
    errors = {}
    for name in info:
        original = base.get_submodule(name)
        q = copy.deepcopy(qmodel.get_submodule(name))
        q.activation = "none"
        base.set_submodule(name, q)
        token_errors = [
            _token_errors(first_tensor(base(**b)).float(), r, b.get("attention_mask"))
            for b, r in zip(calibration, refs, strict=True)
        ]
        base.set_submodule(name, original)
        errors[name] = float(torch.cat(token_errors).median())
    return errors


def tune(task: Task, config: TuneConfig | None = None, measure_speed: Any = None) -> dict[str, Any]:
    """Search as described in the module docstring. Returns {"model", "report"}.

    measure_speed: optional callable(model) -> ms per forward, for the fallback speed costs."""
    config = config or TuneConfig()
    metric = config.metric or task.metrics[0]
    if metric not in task.metrics:
        raise SquantError(f"metric {metric!r} is not one of this task's: {', '.join(task.metrics)}")
    fp32 = task.score(task.model, "fp32")[metric]
    tried: list[dict[str, Any]] = []

    def attempt(qconfig: SmoothQuantConfig, label: str) -> tuple[nn.Module, float]:
        t0 = time.perf_counter()
        q = quantize(task.model, qconfig, task.calibration, progress=False)
        scores = task.score(q, label)  # every metric is kept in the report
        loss = relative_loss(scores[metric], fp32)
        tried.append(
            {
                "config": qconfig.to_dict(),
                **scores,
                "loss_percent": loss,
                "within_budget": loss <= config.max_loss,
                "seconds": time.perf_counter() - t0,
            }
        )
        return q, loss

    best: tuple[nn.Module, float, SmoothQuantConfig] | None = None
    for mode in config.modes:
        for alpha in config.alphas:
            qconfig = SmoothQuantConfig(mode=mode, alpha=alpha)
            q, loss = attempt(qconfig, f"{mode} alpha={alpha}")
            if best is None or loss < best[1]:
                best = (q, loss, qconfig)
            if loss <= config.max_loss:
                return _result(q, qconfig, fp32, metric, tried, [], None, config)

    # over budget everywhere: fall back the most sensitive linears of the best candidate
    q, loss, qconfig = best
    ranking = sensitivity(task.model, q, task.calibration)
    order = sorted(ranking, key=ranking.__getitem__, reverse=True)
    fallbacks: list[dict[str, Any]] = []
    base_ms = measure_speed(q) if measure_speed else None
    excluded: list[str] = []
    for name in order[: config.max_fallback]:
        excluded.append(name)
        qconfig = SmoothQuantConfig(**{**qconfig.to_dict(), "exclude": tuple(excluded)})
        q, loss = attempt(qconfig, f"fallback {len(excluded)}")
        step = {"fell_back": name, "sensitivity": ranking[name], "loss_percent": loss}
        if measure_speed:
            step["ms"] = measure_speed(q)
            step["slowdown_vs_full_int8"] = step["ms"] / base_ms
        fallbacks.append(step)
        if loss <= config.max_loss:
            return _result(q, qconfig, fp32, metric, tried, fallbacks, ranking, config)
    report = _report(qconfig, fp32, metric, tried, fallbacks, ranking, config)
    report["within_budget"] = False
    return {"model": q, "report": report}


def _report(qconfig, fp32, metric, tried, fallbacks, ranking, config) -> dict[str, Any]:
    return {
        "budget_percent": config.max_loss,
        "metric": metric,
        "fp32": fp32,
        "chosen": qconfig.to_dict(),
        "tried": tried,
        "fallbacks": fallbacks,
        "sensitivity": ranking,
        "tune_config": asdict(config),
    }


def _result(q, qconfig, fp32, metric, tried, fallbacks, ranking, config) -> dict[str, Any]:
    report = _report(qconfig, fp32, metric, tried, fallbacks, ranking, config)
    report["within_budget"] = True
    return {"model": q, "report": report}
