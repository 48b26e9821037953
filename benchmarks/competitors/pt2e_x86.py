"""Upstream PT2E static quantization with X86InductorQuantizer (the fastest upstream path).

The default global qconfig fails on XLM-R ("histogram_cpu" not implemented for 'Int'); then
a Linear-only qconfig is used, as a user would have to.
"""

from __future__ import annotations

import copy

import torch

from .common import compile_frozen, main_output


def setup(model, calibration, inputs):
    import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer as xiq
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    def quantize(linear_only: bool):
        quantizer = xiq.X86InductorQuantizer()
        qconfig = xiq.get_default_x86_inductor_quantization_config()
        if linear_only:
            quantizer.set_module_type_qconfig(torch.nn.Linear, qconfig)
        else:
            quantizer.set_global(qconfig)
        exported = torch.export.export(copy.deepcopy(model), (), kwargs=dict(inputs)).module()
        prepared = prepare_pt2e(exported, quantizer)
        with torch.no_grad():
            for batch in calibration:
                prepared(**batch)
        return convert_pt2e(prepared)

    try:
        converted, note = quantize(linear_only=False), "global qconfig"
    except RuntimeError:
        converted, note = quantize(linear_only=True), "Linear-only qconfig (global failed)"
    run = compile_frozen(converted)
    fn = lambda x: main_output(run(**x))  # noqa: E731
    fn.note = note
    return fn
