"""OpenVINO INT8 (NNCF, SmoothQuant for transformers) on the stress set of stress.py, with the
same calibration sentences, beside squant (issue: static that holds on every input).

    python benchmarks/stress_openvino.py --snli-dir .cache/snli     # needs squant[peers]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from competitors.openvino_nncf import _KeywordCall
from stress import embed_one, load_setup, stress_inputs

from squant.bench.report import format_table


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--snli-dir", type=Path, default=Path(".cache/snli"))
    p.add_argument("--calib-size", type=int, default=256)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    import nncf
    import openvino as ov

    model, tok, rows, sents = load_setup(args.snli_dir, args.calib_size)
    inputs = stress_inputs(rows[args.calib_size :])
    example = tok(["an example"], return_tensors="pt")
    with torch.no_grad():  # no `input=`: every dimension stays dynamic
        ov_model = ov.convert_model(
            _KeywordCall(model).eval(),
            example_input=(example["input_ids"], example["attention_mask"]),
        )
    calib = [tok([s], truncation=True, max_length=128, return_tensors="np") for s in sents]
    data = nncf.Dataset(calib, lambda b: (b["input_ids"], b["attention_mask"]))
    quantized = nncf.quantize(
        ov_model, data, model_type=nncf.ModelType.TRANSFORMER, subset_size=len(calib)
    )
    compiled = ov.Core().compile_model(quantized, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})

    def ov_embed(text: str) -> torch.Tensor:
        enc = tok([text], truncation=True, max_length=512, return_tensors="np")
        h = torch.from_numpy(
            next(iter(compiled([enc["input_ids"], enc["attention_mask"]]).values())).copy()
        )
        m = torch.from_numpy(enc["attention_mask"]).unsqueeze(-1).float()
        return torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=-1)[0]

    record = {}
    for k, v in inputs.items():
        record[k] = float(ov_embed(v) @ embed_one(model, tok, v))
    table = [[k, f"{c:.4f}"] for k, c in record.items()]
    table.append(["worst", f"{min(record.values()):.4f}"])
    print(format_table(["input", "OpenVINO INT8 (NNCF)"], table))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"openvino_int8": record}, indent=2))


if __name__ == "__main__":
    main()
