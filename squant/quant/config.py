"""Quantization settings as a frozen value that travels with every result and saved model."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal, get_args

from ..errors import SquantError

Mode = Literal["static", "dynamic"]
ActRange = Literal["minmax", "percentile"]
AttentionKind = Literal["auto", "float", "int8"]

# each choice once, as a Literal; its tuple (for checks and CLI choices) derived from it
MODES: tuple[str, ...] = get_args(Mode)
SITE_KINDS: tuple[str, ...] = ("qkv", "attn_out", "ffn_in", "ffn_out")
ACT_RANGES: tuple[str, ...] = get_args(ActRange)
ATTENTION_KINDS: tuple[str, ...] = get_args(AttentionKind)
# a handful of channels carry BERT's outliers; more would turn the float side GEMM into real work
MAX_OUTLIER_CHANNELS = 64

# What `alpha` and `outlier_sites` mean when left at None: each mode's best worst-case on real
# all-MiniLM-L6-v2 (benchmarks/stress.py; docs/quantization.md, "Static INT8 that holds on
# unusual inputs"). Static keeps the searched alpha and one float-outlier site (FFN-out), at
# no measurable latency. Dynamic
# quantizes every token with its own scale, so smoothing only has channel outliers left to
# fix, and the float outlier channels fix those exactly: alpha 0 with them at Q|K|V, FFN-in
# and FFN-out held every stress input at >= 0.996, where the searched alpha with FFN-out only
# fell to 0.989 on a 512-token repeat.
MODE_DEFAULTS: dict[str, dict[str, Any]] = {
    "static": {"alpha": "auto", "outlier_sites": ("ffn_out",)},
    "dynamic": {"alpha": 0.0, "outlier_sites": ("qkv", "ffn_in", "ffn_out")},
}


@dataclass(frozen=True)
class SmoothQuantConfig:
    """How to quantize an encoder.

    mode: "static" uses one activation scale/zero-point per linear input, fixed at calibration;
        "dynamic" computes a symmetric scale per token at run time.
    alpha: SmoothQuant migration strength in [0, 1]; s = max|X|^a / max|W|^(1-a) per input
        channel. 0 means plain W8A8 (no smoothing). "auto" searches it per linear (0 to
        alpha_max in steps of 0.05) for the smallest int8 output error on a sample of
        calibration tokens. None (default): the mode's default, "auto" for static, 0 for
        dynamic (MODE_DEFAULTS).
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
    outlier_channels: per linear of the `outlier_sites` kinds, the input channels with the
        largest calibrated magnitude (BERT's "massive activation" dimensions) that are
        multiplied in float32 beside the int8 GEMM instead of inside it, so they neither widen
        the int8 grid of every other channel nor force the smoothing to push them into the
        weights. 0 turns it off.
    outlier_sites: the kinds of GEMM that get outlier channels. None (default): the mode's
        default (MODE_DEFAULTS), FFN-out for static, whose input (the GELU output) carried the
        worst-case error on real MiniLM; Q|K|V, FFN-in and FFN-out for dynamic. Each site
        costs a little latency (benchmarks/outlier_cost.py).
    alpha_max: the largest alpha the "auto" search may pick. Above 0.5 the search fitted the
        calibration set's channel profile and lost worst-case accuracy on inputs unlike it.
    attention: "int8" runs squant's C++ kernel: Q·Kᵀ in int8 with a scale per query and key row,
        computed at run time, softmax in FP32, P·V in 16-bit integers, padded keys skipped
        (see kernels/int8_attention.cpp); built once on first use, it needs a C++ compiler.
        "float" keeps the attention (Q·Kᵀ, softmax, P·V) in floating point. "auto" (default):
        int8 where the kernel builds, float with a warning where it cannot; quantize records
        which one ran, so a saved model states it.
    """

    mode: Mode = "static"
    alpha: float | Literal["auto"] | None = None
    act_range: ActRange = "minmax"
    percentile: float = 99.99
    exclude: tuple[str, ...] = ()
    search_tokens: int = 512
    dynamic_sites: tuple[str, ...] = ("attn_out", "ffn_out")
    outlier_channels: int = 4
    outlier_sites: tuple[str, ...] | None = None
    alpha_max: float = 0.5
    attention: AttentionKind = "auto"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise SquantError(f"mode must be one of {MODES}, got {self.mode!r}")
        # None: the mode's default, resolved here so every saved config states what ran
        for name, value in MODE_DEFAULTS[self.mode].items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, value)
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
        if isinstance(self.outlier_channels, bool) or not isinstance(self.outlier_channels, int):
            raise SquantError(f"outlier_channels must be an integer, got {self.outlier_channels!r}")
        if not 0 <= self.outlier_channels <= MAX_OUTLIER_CHANNELS:
            raise SquantError(
                f"outlier_channels must be in [0, {MAX_OUTLIER_CHANNELS}], "
                f"got {self.outlier_channels}"
            )
        if self.attention not in ATTENTION_KINDS:
            raise SquantError(f"attention must be one of {ATTENTION_KINDS}, got {self.attention!r}")
        if self.act_range not in ACT_RANGES:
            raise SquantError(f"act_range must be one of {ACT_RANGES}, got {self.act_range!r}")
        if not 50.0 < float(self.percentile) <= 100.0:
            raise SquantError(f"percentile must be in (50, 100], got {self.percentile}")
        object.__setattr__(self, "percentile", float(self.percentile))
        object.__setattr__(self, "exclude", tuple(self.exclude))
        for name in ("dynamic_sites", "outlier_sites"):
            kinds = tuple(getattr(self, name))
            object.__setattr__(self, name, kinds)
            unknown = set(kinds) - set(SITE_KINDS)
            if unknown:
                raise SquantError(f"{name} takes {SITE_KINDS}, got {sorted(unknown)}")
        if isinstance(self.alpha_max, bool) or not isinstance(self.alpha_max, int | float):
            raise SquantError(f"alpha_max must be a number in [0, 1], got {self.alpha_max!r}")
        if not 0.0 <= float(self.alpha_max) <= 1.0:
            raise SquantError(f"alpha_max must be in [0, 1], got {self.alpha_max}")
        object.__setattr__(self, "alpha_max", float(self.alpha_max))

    def mode_for(self, kind: str) -> str:
        """The activation mode of one kind of GEMM."""
        return "dynamic" if kind in self.dynamic_sites else self.mode

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["exclude"] = list(self.exclude)
        d["dynamic_sites"] = list(self.dynamic_sites)
        d["outlier_sites"] = list(self.outlier_sites or ())
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SmoothQuantConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise SquantError(f"unknown SmoothQuantConfig fields {sorted(unknown)}")
        # saved before these fields existed: no float outlier channels, alpha searched to 1,
        # float attention (and before per-mode defaults every saved config named its alpha
        # and sites)
        return cls(**{"outlier_channels": 0, "alpha_max": 1.0, "attention": "float", **d})
