"""squant.compile: a quantized (or float) encoder turned into a fast, checked CPU executable.

- TorchInductor with freezing: weights become constants, the oneDNN-packed int8 weights are
  used as they are, and each activation-quantize step fuses into the kernel that produces its
  input (LayerNorm, GELU, ...). Inductor settings are patched around each call of the compiled
  model (dynamo reads `freezing` while tracing, which happens lazily at a call, and again for
  each new input shape), and restored after it: nothing global changes.
- The parts that stay floating point (embeddings, LayerNorm, attention, softmax) run in BF16
  where the CPU has native BF16 math (AVX512-BF16 or AMX); int8 GEMMs are unaffected.
- The compiled model is checked against the eager model it came from on example inputs, and
  refused (SquantError) if the outputs disagree.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn

from .errors import SquantError
from .hardware import cpu_features
from .qlinear import QuantLinear

FloatDtype = Literal["auto", "bf16", "fp32"]


@dataclass(frozen=True)
class CompileConfig:
    """float_dtype: dtype of the non-int8 parts; "auto" = bf16 when the CPU has native BF16.
    dynamic: compile for varying sequence lengths (False: one specialization per shape).
    min_cosine: the compiled model's outputs must match the eager ones at least this well.
    max_autotune: let inductor time its CPP GEMM template against oneDNN per shape; off by
        default (upstream it produced wrong results on a VNNI-only CPU; squant checks).
    """

    float_dtype: FloatDtype = "auto"
    dynamic: bool = False
    min_cosine: float = 0.999
    max_autotune: bool = False

    def __post_init__(self) -> None:
        if self.float_dtype not in ("auto", "bf16", "fp32"):
            raise SquantError(f"float_dtype must be auto, bf16 or fp32, got {self.float_dtype!r}")
        if not 0.0 < self.min_cosine <= 1.0:
            raise SquantError(f"min_cosine must be in (0, 1], got {self.min_cosine}")

    def resolved_dtype(self) -> torch.dtype:
        if self.float_dtype == "fp32":
            return torch.float32
        if self.float_dtype == "bf16":
            return torch.bfloat16
        return torch.bfloat16 if cpu_features().native_bf16 else torch.float32

    def inductor_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"freezing": True}
        if self.max_autotune:
            options.update(max_autotune=True, max_autotune_gemm_backends="CPP,ATEN")
        return options


def cast_float_parts(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Cast every floating parameter/buffer to dtype except QuantLinear's scales, which the
    int8 GEMM needs in float32. In place; returns the model."""
    for module in model.modules():
        if isinstance(module, QuantLinear):
            continue
        for name, p in list(module.named_parameters(recurse=False)):
            if p.is_floating_point():
                setattr(module, name, nn.Parameter(p.detach().to(dtype), requires_grad=False))
        for name, b in list(module.named_buffers(recurse=False)):
            if b is not None and b.is_floating_point():
                module.register_buffer(
                    name, b.to(dtype), persistent=name not in module._non_persistent_buffers_set
                )
    return model


def _to_float32(out: Any) -> Any:
    if isinstance(out, Tensor):
        return out.float() if out.is_floating_point() else out
    if isinstance(out, Mapping):  # transformers ModelOutput keeps its type
        return type(out)(**{k: _to_float32(v) for k, v in out.items()})
    if isinstance(out, tuple):
        return type(out)(_to_float32(v) for v in out)
    return out


class CompiledEncoder(nn.Module):
    """The compiled model; same call signature, float outputs returned as float32."""

    def __init__(self, model: nn.Module, compiled: Any, config: CompileConfig, dtype: torch.dtype):
        super().__init__()
        self.model = model
        self._compiled = compiled
        self.compile_config = config
        self.float_dtype = dtype

    @property
    def config(self) -> Any:
        return self.model.config

    @property
    def squant_info(self) -> Any:
        return getattr(self.model, "squant_info", None)

    @torch.no_grad()
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with torch._inductor.config.patch(self.compile_config.inductor_options()):
            return _to_float32(self._compiled(*args, **kwargs))

    def describe(self) -> dict[str, Any]:
        return {**asdict(self.compile_config), "resolved_float_dtype": str(self.float_dtype)}


def _cosine(a: Tensor, b: Tensor) -> float:
    return float(nn.functional.cosine_similarity(a.flatten().float(), b.flatten().float(), 0))


def _first_tensor(out: Any) -> Tensor:
    if isinstance(out, Tensor):
        return out
    values = out.values() if isinstance(out, Mapping) else out
    return next(v for v in values if isinstance(v, Tensor))


def compile(  # the public name mirrors torch.compile
    model: nn.Module,
    config: CompileConfig | None = None,
    example_inputs: Mapping[str, Tensor] | None = None,
) -> CompiledEncoder:
    """Compile an encoder (squant-quantized or float) for CPU inference.

    example_inputs: a tokenizer output to compile and check with now (recommended); without
    it compilation happens on the first call and is not checked.
    """
    config = config or CompileConfig()
    dtype = config.resolved_dtype()
    work = copy.deepcopy(model).eval()
    if dtype != torch.float32:
        cast_float_parts(work, dtype)
    compiled = torch.compile(work, dynamic=config.dynamic, options=config.inductor_options())
    result = CompiledEncoder(work, compiled, config, dtype)
    if example_inputs is not None:
        inputs = dict(example_inputs)
        with torch.no_grad():
            reference = _first_tensor(model(**inputs))
            got = _first_tensor(result(**inputs))
        cos = _cosine(reference, got)
        if not cos >= config.min_cosine:
            raise SquantError(
                f"the compiled model disagrees with the eager one (cosine {cos:.5f} < "
                f"{config.min_cosine}); refusing it. Try float_dtype='fp32' or max_autotune=False"
            )
        result.check_cosine = cos
    return result
