"""Calibration: memory-bounded activation statistics gathered with forward hooks.

Nothing here keeps every activation: a ChannelRange holds two [channels] vectors, a Histogram
a fixed number of bins, a TokenSample at most `max_tokens` rows (a uniform sample, for the
alpha search), whatever the number or the sequence lengths of calibration batches.
Padding positions (attention_mask == 0) are left out of every statistic.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from ..errors import SquantError
from .mappings import max_positions, model_inputs


class Observer(Protocol):
    def update(self, x: Tensor) -> None:
        """x: [tokens, channels] float."""


class ChannelRange:
    """Running per-channel min and max of a [tokens, channels] stream."""

    def __init__(self) -> None:
        self.min: Tensor | None = None
        self.max: Tensor | None = None
        self.tokens = 0

    def update(self, x: Tensor) -> None:
        if x.shape[0] == 0:
            return
        x = x.detach().float()
        lo, hi = x.amin(dim=0), x.amax(dim=0)
        if self.min is None or self.max is None:
            self.min, self.max = lo, hi
        else:
            self.min = torch.minimum(self.min, lo)
            self.max = torch.maximum(self.max, hi)
        self.tokens += x.shape[0]

    @property
    def bounds(self) -> tuple[Tensor, Tensor]:
        """Per-channel (min, max) seen."""
        if self.min is None or self.max is None:
            raise SquantError("no calibration tokens reached this layer")
        return self.min, self.max

    @property
    def absmax(self) -> Tensor:
        lo, hi = self.bounds
        return torch.maximum(lo.abs(), hi.abs())

    def range_after(self, multiplier: Tensor) -> tuple[float, float]:
        """(lo, hi) over all channels of x * multiplier (multiplier > 0, per channel)."""
        lo, hi = self.bounds
        return float((lo * multiplier).min()), float((hi * multiplier).max())


class TokenSample:
    """A uniform random sample of at most `max_tokens` rows of a [tokens, channels] stream.

    Every row gets a random key and the rows with the largest keys are kept (priority
    sampling), so the sample is uniform over all rows seen, in O(max_tokens x channels).
    """

    def __init__(self, max_tokens: int = 512, seed: int = 0) -> None:
        self.max_tokens = max_tokens
        self.rows: Tensor | None = None
        self.keys: Tensor | None = None
        self.generator = torch.Generator().manual_seed(seed)

    def update(self, x: Tensor) -> None:
        if x.shape[0] == 0:
            return
        x = x.detach().float()
        keys = torch.rand(x.shape[0], generator=self.generator)
        if self.rows is not None and self.keys is not None:
            x, keys = torch.cat([self.rows, x]), torch.cat([self.keys, keys])
        if x.shape[0] > self.max_tokens:
            top = keys.topk(self.max_tokens).indices
            x, keys = x[top], keys[top]
        self.rows, self.keys = x.clone(), keys


class ExtremeTokens:
    """The `k` rows with the largest magnitude (max |x| over channels) of a stream: the
    outlier tokens ([CLS]/[SEP], repeated tokens) a uniform sample almost never holds."""

    def __init__(self, k: int = 32) -> None:
        self.k = k
        self.rows: Tensor | None = None

    def update(self, x: Tensor) -> None:
        if x.shape[0] == 0:
            return
        x = x.detach().float()
        if self.rows is not None:
            x = torch.cat([self.rows, x])
        if x.shape[0] > self.k:
            x = x[x.abs().amax(dim=1).topk(self.k).indices]
        self.rows = x.clone()


class SiteStats:
    """Pass-1 statistics of one linear's input: channel ranges, and a token sample when the
    smoothing strength is searched."""

    def __init__(self, sample_tokens: int = 0, extreme_tokens: int = 32) -> None:
        self.range = ChannelRange()
        self.sample = TokenSample(sample_tokens) if sample_tokens > 0 else None
        self.extremes = ExtremeTokens(extreme_tokens) if sample_tokens > 0 else None

    @property
    def tokens(self) -> int:
        return self.range.tokens

    def update(self, x: Tensor) -> None:
        self.range.update(x)
        if self.sample is not None:
            self.sample.update(x)
        if self.extremes is not None:
            self.extremes.update(x)

    def search_rows(self) -> Tensor:
        """The tokens the alpha search scores: the uniform sample plus the extreme tokens."""
        parts = [
            t.rows for t in (self.sample, self.extremes) if t is not None and t.rows is not None
        ]
        return torch.cat(parts)


class Histogram:
    """Histogram of every value of a stream, over a symmetric range [-R, R].

    When a value falls outside, R doubles and adjacent bin pairs merge into the middle half of
    the new bins: counts are never spread by guess, and memory stays `bins` integers.
    """

    def __init__(self, bins: int = 4096) -> None:
        if bins % 4:
            raise ValueError("bins must be a multiple of 4")
        self.bins = bins
        self.radius = 0.0
        self.counts = torch.zeros(bins, dtype=torch.float64)

    def update(self, x: Tensor) -> None:
        x = x.detach().float().reshape(-1)
        if x.numel() == 0:
            return
        peak = float(x.abs().max())
        if self.radius == 0.0:
            self.radius = max(peak, 1e-8)
        while peak > self.radius:
            self._double()
        self.counts += torch.histc(x, self.bins, -self.radius, self.radius).double()

    def _double(self) -> None:
        merged = self.counts.view(-1, 2).sum(dim=1)
        self.counts = torch.zeros_like(self.counts)
        q = self.bins // 4
        self.counts[q : 3 * q] = merged
        self.radius *= 2.0

    def quantile(self, q: float) -> float:
        """Value below which a fraction q of the samples lie (linear inside a bin)."""
        total = float(self.counts.sum())
        if total == 0:
            raise SquantError("no calibration tokens reached this layer")
        cdf = torch.cumsum(self.counts, 0)
        target = q * total
        i = int(torch.searchsorted(cdf, torch.tensor([target], dtype=torch.float64)).item())
        i = min(i, self.bins - 1)
        below = float(cdf[i - 1]) if i > 0 else 0.0
        inside = float(self.counts[i])
        frac = (target - below) / inside if inside > 0 else 1.0
        width = 2 * self.radius / self.bins
        return -self.radius + (i + min(max(frac, 0.0), 1.0)) * width

    def percentile_range(self, percentile: float) -> tuple[float, float]:
        """(lo, hi) keeping `percentile` % of the mass at each end."""
        p = percentile / 100.0
        return self.quantile(1.0 - p), self.quantile(p)


class InputObservers:
    """Context manager: feeds the (optionally pre-scaled) inputs of named modules to observers.

    with InputObservers(modules, ChannelRange) as obs:
        run_batches(model, batches, obs)
    obs.observers[name] -> the observer of that module's input
    """

    def __init__(
        self,
        modules: Mapping[str, nn.Module],
        make_observer: Callable[[], Any],
        multipliers: Mapping[str, Tensor] | None = None,
    ) -> None:
        self.modules = dict(modules)
        self.observers = {name: make_observer() for name in self.modules}
        self.multipliers = dict(multipliers or {})
        self.token_mask: Tensor | None = None
        self._handles: list[Any] = []

    def _hook(self, name: str) -> Callable[[nn.Module, tuple[Any, ...]], None]:
        def hook(_module: nn.Module, args: tuple[Any, ...]) -> None:
            x = args[0]
            mask = self.token_mask
            if mask is not None and tuple(x.shape[:-1]) == tuple(mask.shape):
                x = x[mask.bool()]
            x = x.reshape(-1, x.shape[-1])
            if name in self.multipliers:
                x = x * self.multipliers[name]
            self.observers[name].update(x)

        return hook

    def __enter__(self) -> InputObservers:
        for name, module in self.modules.items():
            self._handles.append(module.register_forward_pre_hook(self._hook(name)))
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()


def prepare_batches(calibration: Iterable[Any] | None, model: nn.Module) -> list[dict[str, Tensor]]:
    """Validate calibration batches (tokenizer outputs or input_ids tensors) into model kwargs."""
    if calibration is None:
        raise SquantError("calibration data is required: pass calibration=[tokenizer(...), ...]")
    if isinstance(calibration, Mapping | Tensor):
        calibration = [calibration]
    limit = max_positions(model)
    vocab = int(getattr(model.config, "vocab_size", 0)) or None
    batches = []
    for i, batch in enumerate(calibration):
        if isinstance(batch, Tensor):
            batch = {"input_ids": batch}
        if not isinstance(batch, Mapping) or "input_ids" not in batch:
            raise SquantError(
                f"calibration batch {i} must be a tokenizer output (with input_ids) or a tensor "
                f"of token ids, got {type(batch).__name__}"
            )
        inputs = {k: torch.as_tensor(v) for k, v in model_inputs(model, batch).items()}
        ids = inputs["input_ids"]
        if ids.dim() == 1:
            inputs = {k: v.unsqueeze(0) for k, v in inputs.items()}
            ids = inputs["input_ids"]
        if ids.dim() != 2 or ids.dtype.is_floating_point:
            raise SquantError(
                f"calibration batch {i}: input_ids must be integer [batch, seq], "
                f"got {ids.dtype} {tuple(ids.shape)}"
            )
        if ids.numel() == 0 or ids.shape[1] == 0:
            raise SquantError(f"calibration batch {i} is empty (no tokens)")
        if ids.shape[1] > limit:
            raise SquantError(
                f"calibration batch {i} has sequence length {ids.shape[1]}, longer than the "
                f"model's {limit} positions; truncate it (tokenizer(..., truncation=True))"
            )
        if vocab is not None and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
            raise SquantError(
                f"calibration batch {i} has token ids outside [0, {vocab}): wrong tokenizer?"
            )
        batches.append(inputs)
    if not batches:
        raise SquantError("the calibration set is empty: give at least one batch")
    return batches


@torch.no_grad()
def run_batches(
    model: nn.Module,
    batches: list[dict[str, Tensor]],
    observers: InputObservers,
    desc: str = "calibrating",
    progress: bool = True,
) -> None:
    """Forward every batch once with the observers' hooks active."""
    for inputs in tqdm(batches, desc=desc, disable=not progress, leave=False):
        observers.token_mask = inputs.get("attention_mask")
        model(**inputs)
    observers.token_mask = None
