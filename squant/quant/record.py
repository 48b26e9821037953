"""The quantization record: what squant.quantize did to each linear (mode, alpha, fused
activation), how it was configured and what the calibration covered. Set on the quantized
model as `model.squant_info`, saved as "quantization" in squant.json and in export
manifests, read by tune, eval, the quantize report and the server. One type, so a reader
never guesses a dict key.

The JSON form is unchanged from the untyped dict squant wrote before (saved models of every
format version still load); `from_dict` checks the types of every field, while the
checks against a concrete model (site names, shapes) stay in serialization.py.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import SquantError
from . import int8
from .config import MODES, SmoothQuantConfig


@dataclass(frozen=True)
class LinearRecord:
    """One quantized GEMM. absorbs: the activation module the GEMM's epilogue replaced;
    outliers: how many input channels it multiplies in float beside the int8 GEMM."""

    kind: str
    layer: int
    in_features: int
    out_features: int
    bias: bool
    mode: str
    alpha: float | None = None
    activation: str = "none"
    absorbs: str | None = None
    outliers: int = 0

    @classmethod
    def from_dict(cls, d: Any, where: str) -> LinearRecord:
        if not isinstance(d, dict):
            raise SquantError(f"{where} must be an object")
        unknown = set(d) - {f for f in cls.__dataclass_fields__}
        if unknown:
            raise SquantError(f"{where}: unknown fields {sorted(unknown)}")
        rec = cls(
            kind=_get(d, "kind", str, where, default=""),
            layer=_get(d, "layer", int, where, default=-1),
            in_features=_get(d, "in_features", int, where),
            out_features=_get(d, "out_features", int, where),
            bias=_get(d, "bias", bool, where),
            mode=_get(d, "mode", str, where),
            alpha=_get(d, "alpha", (int, float, type(None)), where, default=None),
            activation=_get(d, "activation", str, where, default="none"),
            absorbs=_get(d, "absorbs", (str, type(None)), where, default=None),
            outliers=_get(d, "outliers", int, where, default=0),
        )
        if not 0 <= rec.outliers <= rec.in_features:
            raise SquantError(
                f"{where}: outliers {rec.outliers} is not in [0, in_features={rec.in_features}]"
            )
        if rec.mode not in MODES:
            raise SquantError(f"{where}: mode {rec.mode!r} is not one of {MODES}")
        if rec.activation not in int8.POST_OPS:
            raise SquantError(
                f"{where}: activation {rec.activation!r} is not one of {tuple(int8.POST_OPS)}"
            )
        if (rec.absorbs is None) != (rec.activation == "none"):
            raise SquantError(
                f"{where}: activation {rec.activation!r} and absorbs {rec.absorbs!r} disagree"
            )
        return rec


@dataclass(frozen=True)
class Coverage:
    """What the calibration saw: static ranges hold for inputs like these."""

    sequences: int
    tokens: int
    min_length: int
    max_length: int

    @classmethod
    def from_dict(cls, d: Any, where: str) -> Coverage:
        if not isinstance(d, dict):
            raise SquantError(f"{where} must be an object")
        return cls(**{k: _get(d, k, int, where) for k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class QuantizationRecord:
    config: SmoothQuantConfig
    modules: Mapping[str, LinearRecord]
    calibration: Coverage | None = None  # absent in models saved before squant recorded it
    extra: Mapping[str, Any] = field(default_factory=dict)  # keys written by newer squant

    @property
    def alphas(self) -> list[float]:
        return [m.alpha for m in self.modules.values() if m.alpha is not None]

    def alpha_summary(self) -> dict[str, float]:
        """min / median / max of the per-linear alpha (empty when none was recorded)."""
        a = self.alphas
        return {"min": min(a), "median": statistics.median(a), "max": max(a)} if a else {}

    def count(self, mode: str) -> int:
        return sum(m.mode == mode for m in self.modules.values())

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            **self.extra,
            "config": self.config.to_dict(),
            "modules": {name: asdict(m) for name, m in self.modules.items()},
        }
        if self.calibration is not None:
            d["calibration"] = asdict(self.calibration)
        return d

    @classmethod
    def from_dict(cls, d: Any, where: str = "quantization") -> QuantizationRecord:
        """Parse a saved record; any malformed field is a SquantError naming it."""
        if not isinstance(d, dict):
            raise SquantError(f"{where} must be an object")
        config_d = _get(d, "config", dict, where)
        try:
            config = SmoothQuantConfig.from_dict(config_d)
        except TypeError as e:
            raise SquantError(f"{where}: config is invalid ({e})") from None
        except SquantError as e:
            raise SquantError(f"{where}: config: {e}") from None
        modules = _get(d, "modules", dict, where)
        if not modules:
            raise SquantError(f"{where}: modules must be a non-empty object")
        calibration = d.get("calibration")
        known = {"config", "modules", "calibration"}
        return cls(
            config=config,
            modules={
                str(n): LinearRecord.from_dict(m, f"{where}: module {n!r}")
                for n, m in modules.items()
            },
            calibration=None
            if calibration is None
            else Coverage.from_dict(calibration, f"{where}: calibration"),
            extra={k: v for k, v in d.items() if k not in known},
        )


def record_of(model: Any) -> QuantizationRecord | None:
    """The record of a model squant quantized (or of a wrapper around one); None otherwise."""
    info = getattr(model, "squant_info", None)
    return info if isinstance(info, QuantizationRecord) else None


_MISSING = object()


def _get(
    d: dict[str, Any],
    key: str,
    kind: type | tuple[type, ...],
    where: str,
    default: Any = _MISSING,
) -> Any:
    if key not in d:
        if default is _MISSING:
            raise SquantError(f"{where} is missing field {key!r}")
        return default
    value = d[key]
    bool_as_number = isinstance(value, bool) and kind is not bool and bool not in _tuple(kind)
    if not isinstance(value, kind) or bool_as_number:
        raise SquantError(f"{where}: field {key!r} has the wrong type ({type(value).__name__})")
    return value


def _tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)
