"""Out-of-range signal for static INT8: how often inputs leave the calibrated ranges.

    with RangeMonitor(qmodel) as monitor:
        out = monitor(**batch)     # the model's output; eager calls, as many as you like
    monitor.report()               # {module: {"tokens": n, "clipped_tokens": k, "fraction": f}}

A static linear quantizes its (smoothed) input on a grid fixed at calibration; a token with
any value outside that grid is clipped, silently. Counting those tokens tells a deployment
that its traffic no longer looks like its calibration set (a drift alarm), before accuracy
reports would. Counted, never raised; one min/max reduction per token and static linear,
eager mode only (hooks do not run inside a compiled graph: monitor a sample of traffic on
the eager model next to the compiled one).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from . import int8
from .qlinear import QuantLinear


class RangeMonitor:
    """Context manager counting, per static QuantLinear, the tokens whose input falls outside
    the calibrated grid [(0 - zp)·scale, (255 - zp)·scale] after smoothing."""

    def __init__(self, model: nn.Module) -> None:
        self.modules = {
            name: m
            for name, m in model.named_modules()
            if isinstance(m, QuantLinear) and m.mode == "static"
        }
        self.model = model
        self.counts = {name: [0, 0] for name in self.modules}  # tokens, clipped tokens
        # threads may share one monitor (a server's workers share one model): each call's
        # padding mask is its own thread's, the counts are added under a lock
        self._local = threading.local()
        self._lock = threading.Lock()
        self._handles: list[Any] = []

    @torch.no_grad()
    def __call__(self, **inputs: Any) -> Any:
        """Run the model; padding positions (attention_mask == 0) are not counted: their
        values are never used, and calibration never saw them either."""
        self._local.mask = inputs.get("attention_mask")
        try:
            return self.model(**inputs)
        finally:
            self._local.mask = None

    def _hook(self, name: str, module: QuantLinear) -> Callable[..., None]:
        # beyond half a step past either end of the grid, rounding alone no longer covers it
        half = module._x_scale / 2
        lo = (int8.QMIN_A - module._x_zero_point) * module._x_scale - half
        hi = (int8.QMAX_A - module._x_zero_point) * module._x_scale + half

        def hook(_m: nn.Module, args: tuple[Any, ...]) -> None:
            x: Tensor = args[0]
            mask = getattr(self._local, "mask", None)
            if mask is not None and tuple(x.shape[:-1]) == tuple(mask.shape):
                x = x[mask.bool()]
            x = x.reshape(-1, module.in_features).float() * module.input_multiplier
            outside = int(((x.amin(dim=1) < lo) | (x.amax(dim=1) > hi)).sum())
            with self._lock:
                self.counts[name][0] += x.shape[0]
                self.counts[name][1] += outside

        return hook

    def __enter__(self) -> RangeMonitor:
        for name, m in self.modules.items():
            self._handles.append(m.register_forward_pre_hook(self._hook(name, m)))
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def report(self) -> dict[str, dict[str, float]]:
        with self._lock:
            counts = {name: tuple(c) for name, c in self.counts.items()}
        return {
            name: {"tokens": n, "clipped_tokens": k, "fraction": k / n if n else 0.0}
            for name, (n, k) in counts.items()
        }

    def clipped_fraction(self) -> float:
        """Over all static linears: the share of token inputs that were clipped."""
        with self._lock:
            n = sum(c[0] for c in self.counts.values())
            k = sum(c[1] for c in self.counts.values())
        return k / n if n else 0.0
