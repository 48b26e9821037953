"""Model variants by name: the one registry `eval`, `bench`, `analyze`, `tune` and the
benchmarks build from.

A name is PRECISION or PRECISION-RUNTIME:
    precision  fp32 | bf16 (float GEMMs) | static | dynamic (SmoothQuant INT8 GEMMs)
    runtime    eager (no suffix) | compiled (squant.compile) | pt2 (squant.export package)

    variant = build(parse("static-pt2"), fp32_model, BuildContext(calibration, example))
    out = variant(**model_inputs(variant, batch))   # same call and outputs for every variant

Compiled and packaged variants run at a bounded set of shapes (shapes.PaddedShapes): a fixed
batch (the example's) and sequence-length buckets, so `eval` scores exactly the code a
deployment runs, on inputs of any length.
"""

from __future__ import annotations

import copy
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import SquantError

PRECISIONS = ("fp32", "bf16", "static", "dynamic")
RUNTIMES = ("eager", "compiled", "pt2")
# the dtype each precision's GEMMs run in (roofline bounds, reports)
GEMM_DTYPES = {"fp32": "fp32", "bf16": "bf16", "static": "int8", "dynamic": "int8"}


@dataclass(frozen=True)
class Variant:
    precision: str
    runtime: str = "eager"

    @property
    def name(self) -> str:
        return self.precision if self.runtime == "eager" else f"{self.precision}-{self.runtime}"

    @property
    def gemm_dtype(self) -> str:
        return GEMM_DTYPES[self.precision]

    @property
    def quantized(self) -> bool:
        return self.precision in ("static", "dynamic")

    @property
    def needs_example(self) -> bool:
        """Compiled and packaged variants are built for the example inputs' batch shape."""
        return self.runtime != "eager"


VARIANT_NAMES = tuple(Variant(p, r).name for r in RUNTIMES for p in PRECISIONS)


def parse(name: str) -> Variant:
    precision, _, runtime = name.strip().partition("-")
    variant = Variant(precision, runtime or "eager")
    if precision not in PRECISIONS or variant.runtime not in RUNTIMES or runtime == "eager":
        choices = ", ".join(VARIANT_NAMES)
        raise SquantError(f"unknown variant {name.strip()!r}; choose from {choices}")
    return variant


def parse_variants(spec: str | Sequence[str]) -> tuple[Variant, ...]:
    """A comma list (or sequence) of names; empty or repeated names are errors."""
    names = [v for v in (spec.split(",") if isinstance(spec, str) else spec) if v.strip()]
    if not names:
        raise SquantError(f"no variant given; choose from {', '.join(VARIANT_NAMES)}")
    variants = tuple(parse(n) for n in names)
    if len({v.name for v in variants}) != len(variants):
        raise SquantError(f"variant listed twice in {','.join(names)}")
    return variants


@dataclass(frozen=True)
class BuildContext:
    """What building a variant may need besides the FP32 model.

    calibration: token batches for the INT8 variants (never scored).
    example_inputs: a tokenizer batch; compiled/pt2 variants run at its batch size and are
        compiled and checked on it.
    buckets: sequence lengths compiled variants pad to (None: the example's length only);
        packages are exported for any length up to the model's limit.
    instances: calls a package may run at once (serving threads; weights shared).
    """

    calibration: Sequence[Mapping[str, Tensor]] = ()
    alpha: float | str | None = None  # None: the mode's default
    example_inputs: Mapping[str, Tensor] | None = None
    buckets: tuple[int, ...] | None = None
    float_dtype: str = "auto"
    instances: int = 1
    workdir: str | Path | None = None
    kernel_profile: bool = False  # name inductor's kernels in profiler traces
    progress: bool = True


def _quantized(variant: Variant, model: nn.Module, ctx: BuildContext) -> nn.Module:
    from ..checkpoint.quantize_api import quantize
    from ..quant.config import SmoothQuantConfig

    if not ctx.calibration and variant.precision == "static":
        raise SquantError(f"variant {variant.name} needs calibration batches")
    config = SmoothQuantConfig(mode=variant.precision, alpha=ctx.alpha)  # type: ignore[arg-type]
    return quantize(model, config, list(ctx.calibration), progress=ctx.progress)


def _compile_config(variant: Variant, ctx: BuildContext) -> Any:
    from ..runtime.compiler import CompileConfig

    if variant.quantized:
        return CompileConfig(float_dtype=ctx.float_dtype, kernel_profile=ctx.kernel_profile)  # type: ignore[arg-type]
    # float variants: what torch.compile gives (the model's own attention) in that dtype
    return CompileConfig(
        float_dtype=variant.precision,  # type: ignore[arg-type]
        attention="model",
        kernel_profile=ctx.kernel_profile,
    )


def _pad_token(model: nn.Module) -> int:
    return int(getattr(model.config, "pad_token_id", None) or 0)


def build(variant: Variant | str, model: nn.Module, ctx: BuildContext) -> nn.Module:
    """The variant of an FP32 model, called like it (keyword inputs, named outputs)."""
    from ..runtime.shapes import PaddedShapes

    variant = parse(variant) if isinstance(variant, str) else variant
    if variant.needs_example and ctx.example_inputs is None:
        raise SquantError(f"variant {variant.name} is built for a batch shape: pass example_inputs")
    if variant.quantized:
        base = _quantized(variant, model, ctx)
    elif variant.precision == "bf16" and variant.runtime == "eager":
        return copy.deepcopy(model).to(torch.bfloat16)
    else:
        base = model
    if variant.runtime == "eager":
        return base
    assert ctx.example_inputs is not None
    batch = int(ctx.example_inputs["input_ids"].shape[0])
    seq = int(ctx.example_inputs["input_ids"].shape[1])
    if variant.runtime == "compiled":
        from ..runtime.compiler import compile

        shaped = PaddedShapes(None, batch, ctx.buckets or (seq,), _pad_token(model))
        example = shaped.pad(ctx.example_inputs)
        shaped.model = compile(base, _compile_config(variant, ctx), example)
        return shaped
    from ..runtime.export import ExportConfig, export, load_packaged

    directory = Path(ctx.workdir or tempfile.mkdtemp(prefix="squant-variant-")) / variant.name
    example = PaddedShapes(None, batch, None, _pad_token(model), min_seq=2).pad(ctx.example_inputs)
    float_dtype = ctx.float_dtype if variant.quantized else variant.precision
    config = ExportConfig(dynamic_seq=True, float_dtype=float_dtype)  # type: ignore[arg-type]
    export(base, directory, example, config=config)
    package = load_packaged(directory, num_runners=ctx.instances)
    return PaddedShapes(package, batch, None, _pad_token(model), min_seq=2)
