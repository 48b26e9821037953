"""Quantization settings as a frozen value that travels with every result and saved model."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from .errors import SquantError

Mode = Literal["static", "dynamic"]
ActRange = Literal["minmax", "percentile"]

MODES: tuple[str, ...] = ("static", "dynamic")
SITE_KINDS: tuple[str, ...] = ("qkv", "attn_out", "ffn_in", "ffn_out")
ACT_RANGES: tuple[str, ...] = ("minmax", "percentile")


@dataclass(frozen=True)
class SmoothQuantConfig:
    """How to quantize an encoder.

    mode: "static" uses one activation scale/zero-point per linear input, fixed at calibration;
        "dynamic" computes a symmetric scale per token at run time.
    alpha: SmoothQuant migration strength in [0, 1]; s = max|X|^a / max|W|^(1-a) per input
        channel. 0 means plain W8A8 (no smoothing). "auto" searches it per linear (0 to 1 in
        steps of 0.05) for the smallest int8 output error on a sample of calibration tokens.
    act_range: static only. "minmax" takes the calibrated range; "percentile" clips it to the
        given percentile of a (memory-bounded) histogram of the smoothed activations, so a
        handful of extreme tokens do not spend the 8-bit grid.
    percentile: used with act_range="percentile", in (50, 100].
    exclude: fnmatch patterns of module names (as in ``model.named_modules()``) to keep in
        floating point, e.g. ``("*.layer.5.output.dense",)``.
    dynamic_sites: with mode="static", the kinds of GEMM (qkv, attn_out, ffn_in, ffn_out) whose
        input is quantized per token at run time instead. Default: the attention output and
        FFN-out GEMMs, whose inputs (attention context, GELU output) are not LayerNorm outputs
        and vary most between inputs: on real MiniLM they carried the static error on empty,
        one-word and 512-token inputs (benchmarks/stress.py), for 3.8% of compiled latency.
    search_tokens: calibration tokens sampled per linear for alpha="auto".
    """

    mode: Mode = "static"
    alpha: float | Literal["auto"] = "auto"
    act_range: ActRange = "minmax"
    percentile: float = 99.99
    exclude: tuple[str, ...] = ()
    search_tokens: int = 512
    dynamic_sites: tuple[str, ...] = ("attn_out", "ffn_out")

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise SquantError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.alpha != "auto":
            if isinstance(self.alpha, bool) or not isinstance(self.alpha, int | float):
                raise SquantError(f"alpha must be a number in [0, 1] or 'auto', got {self.alpha!r}")
            if not 0.0 <= float(self.alpha) <= 1.0:
                raise SquantError(f"alpha must be in [0, 1], got {self.alpha}")
            object.__setattr__(self, "alpha", float(self.alpha))
        if isinstance(self.search_tokens, bool) or not isinstance(self.search_tokens, int):
            raise SquantError(f"search_tokens must be an integer, got {self.search_tokens!r}")
        if self.search_tokens < 16:
            raise SquantError(f"search_tokens must be >= 16, got {self.search_tokens}")
        if self.act_range not in ACT_RANGES:
            raise SquantError(f"act_range must be one of {ACT_RANGES}, got {self.act_range!r}")
        if not 50.0 < float(self.percentile) <= 100.0:
            raise SquantError(f"percentile must be in (50, 100], got {self.percentile}")
        object.__setattr__(self, "percentile", float(self.percentile))
        object.__setattr__(self, "exclude", tuple(self.exclude))
        object.__setattr__(self, "dynamic_sites", tuple(self.dynamic_sites))
        unknown = set(self.dynamic_sites) - set(SITE_KINDS)
        if unknown:
            raise SquantError(f"dynamic_sites takes {SITE_KINDS}, got {sorted(unknown)}")

    def mode_for(self, kind: str) -> str:
        """The activation mode of one kind of GEMM."""
        return "dynamic" if kind in self.dynamic_sites else self.mode

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["exclude"] = list(self.exclude)
        d["dynamic_sites"] = list(self.dynamic_sites)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SmoothQuantConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise SquantError(f"unknown SmoothQuantConfig fields {sorted(unknown)}")
        return cls(**d)
