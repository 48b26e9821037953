"""OpenVINO with NNCF INT8 post-training quantization (model_type TRANSFORMER: SmoothQuant on).

The CPU plugin's default inference precision on AVX512-BF16 CPUs is BF16: it is set
explicitly (`precision`), so both the f32 and the bf16 flavour can be reported.
"""

from __future__ import annotations

import numpy as np
import torch


class _KeywordCall(torch.nn.Module):
    """Trace the model with keyword inputs (positional order differs across models)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        out = self.model(input_ids=input_ids, attention_mask=attention_mask)
        return out[0]


def setup(
    model,
    calibration,
    inputs,
    precision: str | None = None,
    threads: int | None = None,
    throughput: bool = False,
):
    """precision: the float parts' precision ("f32" / "bf16"); None = the plugin's default
    for this CPU (BF16 where it has native BF16, FP32 otherwise), what a user gets.
    throughput: the THROUGHPUT hint (streams chosen by the plugin), else LATENCY, 1 stream."""
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
    options: dict = {"INFERENCE_NUM_THREADS": threads}
    if precision is not None:
        options["INFERENCE_PRECISION_HINT"] = precision
    options |= (
        {"PERFORMANCE_HINT": "THROUGHPUT"}
        if throughput
        else {
            "PERFORMANCE_HINT": "LATENCY",
            "NUM_STREAMS": 1,
        }
    )
    compiled = ov.Core().compile_model(quantized, "CPU", options)
    if not throughput:
        request = compiled.create_infer_request()

        def run(x):
            result = request.infer([x["input_ids"].numpy(), x["attention_mask"].numpy()])
            return torch.from_numpy(next(iter(result.values())).copy()).float()

        return run
    # THROUGHPUT: the batch is split into its rows, one per request, run by the plugin's
    # streams at once (how its throughput mode is meant to be fed)
    queue = ov.AsyncInferQueue(compiled)
    outs: dict[int, object] = {}
    queue.set_callback(lambda req, i: outs.__setitem__(i, next(iter(req.results.values())).copy()))

    def run_async(x):
        ids, mask = x["input_ids"].numpy(), x["attention_mask"].numpy()
        for i in range(ids.shape[0]):
            queue.start_async([ids[i : i + 1], mask[i : i + 1]], i)
        queue.wait_all()
        return torch.from_numpy(np.concatenate([outs[i] for i in range(ids.shape[0])])).float()

    return run_async
