"""The model variants squant compares, built from one FP32 model by name (a registry)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..config import SmoothQuantConfig
from ..errors import SquantError
from ..quantize import quantize


@dataclass(frozen=True)
class VariantContext:
    """What building a variant may need besides the FP32 model."""

    calibration: list[dict[str, Any]]
    alpha: float | str = "auto"
    progress: bool = True


def _fp32(model: nn.Module, ctx: VariantContext) -> nn.Module:
    return model


def _bf16(model: nn.Module, ctx: VariantContext) -> nn.Module:
    return copy.deepcopy(model).to(torch.bfloat16)


def _int8(mode: str) -> Callable[[nn.Module, VariantContext], nn.Module]:
    def build(model: nn.Module, ctx: VariantContext) -> nn.Module:
        config = SmoothQuantConfig(mode=mode, alpha=ctx.alpha)
        return quantize(model, config, ctx.calibration, progress=ctx.progress)

    return build


VARIANTS: dict[str, Callable[[nn.Module, VariantContext], nn.Module]] = {
    "fp32": _fp32,
    "bf16": _bf16,
    "static": _int8("static"),
    "dynamic": _int8("dynamic"),
}


def parse_variants(spec: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    names = tuple(v.strip() for v in spec.split(",")) if isinstance(spec, str) else tuple(spec)
    unknown = [v for v in names if v not in VARIANTS]
    if unknown or not names:
        raise SquantError(f"unknown variant(s) {unknown}; choose from {', '.join(VARIANTS)}")
    return names


def build_variant(name: str, model: nn.Module, ctx: VariantContext) -> nn.Module:
    return VARIANTS[parse_variants([name])[0]](model, ctx)
