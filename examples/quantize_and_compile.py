"""Quantize an encoder to static INT8, compile it, and check it against FP32.

    python examples/quantize_and_compile.py CHECKPOINT --out int8/

CHECKPOINT is a local Hugging Face directory (a BERT-family encoder). Calibrates on a few
sentences (use a few hundred of your own text in practice), compiles with TorchInductor,
prints the cosine of the compiled INT8 output against FP32 and saves the quantized model.
"""

from __future__ import annotations

import argparse

import torch

import squant
from squant.checkpoint.models import load_model, load_tokenizer

SENTENCES = [
    "the cat sat on the mat .",
    "a man plays music in the park",
    "the red car runs fast",
    "a child and a dog",
    "",
]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoint")
    p.add_argument("--out", required=True, help="where to save the quantized model")
    args = p.parse_args()

    model = load_model(args.checkpoint)  # float32, eval mode
    tok = load_tokenizer(args.checkpoint)
    calibration = [tok(SENTENCES, padding=True, return_tensors="pt")]
    qmodel = squant.quantize(model, squant.SmoothQuantConfig(mode="static"), calibration)

    inputs = tok(["a dog runs in the park", "the cat"], padding=True, return_tensors="pt")
    fast = squant.compile(qmodel, example_inputs=inputs)  # checked against eager here
    with torch.no_grad():
        reference = model(**inputs)[0]
        output = fast(**inputs)[0]
    cosine = torch.nn.functional.cosine_similarity(output.flatten(), reference.flatten(), 0)
    print(f"compiled INT8 vs FP32: cosine {float(cosine):.5f}")
    squant.save(qmodel, args.out, tokenizer=tok)
    print(f"saved -> {args.out}")


if __name__ == "__main__":
    main()
