"""Export a quantized directory to an AOTInductor package and run it.

    python examples/export_and_load.py int8/ --out deploy/

The package accepts any batch and sequence length; `squant.load_exported` checks the
manifest, the archive and the host's ISA before torch loads it, and every input before a
call. A process without squant can run it too, with PyTorch alone (see docs/deploy.md).
"""

from __future__ import annotations

import argparse

import torch

import squant
from squant.checkpoint.models import load_tokenizer


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("quantized", help="a directory from squant quantize / squant.save")
    p.add_argument("--out", required=True, help="the deploy directory to write")
    args = p.parse_args()

    qmodel = squant.load(args.quantized)
    tok = load_tokenizer(args.quantized)
    config = squant.ExportConfig(dynamic_batch=True, dynamic_seq=True)
    squant.export(qmodel, args.out, tokenizer=tok, config=config, overwrite=True)

    package = squant.load_packaged(args.out)  # called like the Hugging Face model
    for texts in (["one sentence"], ["a batch", "of three", "sentences of other lengths"]):
        inputs = tok(texts, padding=True, return_tensors="pt")
        with torch.no_grad():
            reference = qmodel(**inputs)[0]
            output = package(**inputs)[0]
        cosine = torch.nn.functional.cosine_similarity(output.flatten(), reference.flatten(), 0)
        print(
            f"package vs eager, {len(texts)} x {inputs['input_ids'].shape[1]}: {float(cosine):.5f}"
        )


if __name__ == "__main__":
    main()
