"""OpenVINO with NNCF INT8 post-training quantization (model_type TRANSFORMER: SmoothQuant on).

The CPU plugin's default inference precision on AVX512-BF16 CPUs is BF16: it is set
explicitly (`precision`), so both the f32 and the bf16 flavour can be reported.
"""

from __future__ import annotations

import torch


class _KeywordCall(torch.nn.Module):
    """Trace the model with keyword inputs (positional order differs across models)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        out = self.model(input_ids=input_ids, attention_mask=attention_mask)
        return out[0]


def setup(model, calibration, inputs, precision: str = "bf16", threads: int | None = None):
    import nncf
    import openvino as ov

    threads = threads or torch.get_num_threads()
    example = (inputs["input_ids"], inputs["attention_mask"])
    with torch.no_grad():
        ov_model = ov.convert_model(_KeywordCall(model).eval(), example_input=example)
    data = nncf.Dataset(
        calibration, lambda b: (b["input_ids"].numpy(), b["attention_mask"].numpy())
    )
    quantized = nncf.quantize(
        ov_model, data, model_type=nncf.ModelType.TRANSFORMER, subset_size=len(calibration)
    )
    compiled = ov.Core().compile_model(
        quantized,
        "CPU",
        {
            "INFERENCE_PRECISION_HINT": precision,
            "INFERENCE_NUM_THREADS": threads,
            "PERFORMANCE_HINT": "LATENCY",
            "NUM_STREAMS": 1,
        },
    )
    request = compiled.create_infer_request()

    def run(x):
        result = request.infer([x["input_ids"].numpy(), x["attention_mask"].numpy()])
        return torch.from_numpy(next(iter(result.values())).copy()).float()

    return run
