"""Upstream torchao SmoothQuant, static activation quantization (alpha 0.5, per-tensor)."""

from __future__ import annotations

import copy

import torch

from .common import compile_frozen, main_output


def setup(model, calibration, inputs, alpha: float = 0.5):
    # The fast int8 CPU path needs this import for its side effect (registers inductor's x86
    # int8 patterns); it is one of the undocumented switches squant removes.
    import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer  # noqa: F401
    from torchao.prototype.smoothquant import SmoothQuantConfig
    from torchao.quantization import quantize_
    from torchao.quantization.granularity import PerRow, PerTensor
    from torchao.quantization.quant_api import Int8StaticActivationInt8WeightConfig
    from torchao.quantization.quantize_.common.quantization_step import QuantizationStep

    model = copy.deepcopy(model)
    base = Int8StaticActivationInt8WeightConfig(granularity=[PerTensor(), PerRow()])
    config = SmoothQuantConfig(base_config=base, step=QuantizationStep.PREPARE, alpha=alpha)
    quantize_(model, config)
    with torch.no_grad():
        # torchao's static observer fails on batches of different lengths: calibrate at the
        # benchmark's own shape.
        for batch in calibration:
            model(**batch)
    config.step = QuantizationStep.CONVERT
    quantize_(model, config)
    run = compile_frozen(model)
    return lambda x: main_output(run(**x))
