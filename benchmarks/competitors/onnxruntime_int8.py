"""ONNX Runtime with its dynamic INT8 quantization (MatMul weights int8, activations per call)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from .openvino_nncf import _KeywordCall


def setup(model, calibration, inputs, threads: int | None = None):
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    threads = threads or torch.get_num_threads()
    tmp = Path(tempfile.mkdtemp(prefix="squant-ort-"))
    fp32_path, int8_path = tmp / "model.onnx", tmp / "model-int8.onnx"
    # dynamo=False export needs keyword calls (positional order differs across models)
    torch.onnx.export(
        _KeywordCall(model).eval(),
        (inputs["input_ids"], inputs["attention_mask"]),
        str(fp32_path),
        input_names=["input_ids", "attention_mask"],
        output_names=["last_hidden_state"],
        opset_version=17,
        dynamo=False,
    )
    quantize_dynamic(str(fp32_path), str(int8_path), weight_type=QuantType.QInt8)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(int8_path), options, providers=["CPUExecutionProvider"])

    def run(x):
        feed = {"input_ids": x["input_ids"].numpy(), "attention_mask": x["attention_mask"].numpy()}
        return torch.from_numpy(session.run(None, feed)[0]).float()

    return run
