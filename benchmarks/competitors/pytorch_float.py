"""What a PyTorch user gets without quantization: FP32 eager / compiled, BF16 compiled."""

from __future__ import annotations

import copy

import torch

from .common import compile_frozen, main_output


def fp32_eager(model, calibration, inputs):
    def run(x):
        with torch.no_grad():
            return main_output(model(**x))

    return run


def fp32_compiled(model, calibration, inputs):
    """torch.compile defaults (no freezing): FP32 linears stay on MKL sgemm."""
    compiled = torch.compile(model)

    def run(x):
        with torch.no_grad():
            return main_output(compiled(**x))

    return run


def fp32_compiled_frozen(model, calibration, inputs):
    """torch.compile with freezing: FP32 linears prepacked for oneDNN (faster than MKL on AMD)."""
    run = compile_frozen(model)
    return lambda x: main_output(run(**x))


def bf16_compiled(model, calibration, inputs):
    """The model cast to BF16, torch.compile with freezing (oneDNN BF16 GEMMs)."""
    run = compile_frozen(copy.deepcopy(model).to(torch.bfloat16))
    return lambda x: main_output(run(**x))
