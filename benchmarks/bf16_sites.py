"""Which float parts of an INT8 model lose precision in BF16? Runs on any x86 host.

squant.compile's "auto" tries BF16 float parts where the CPU has native BF16 and keeps them
only if the compiled model agrees with eager (cosine >= 0.999 over real tokens). On real
all-MiniLM-L6-v2 INT8 they are refused. This finds out why, without BF16 hardware: the FP32
model is run with BF16 *storage* emulated (values rounded to BF16 and back) where a BF16
compiled graph stores them, at each site alone and at all together:

- weights:   embedding tables and LayerNorm parameters held in BF16;
- emb:       the embeddings' output (the residual stream's start);
- gemm:      every int8 GEMM's float output (bias and activation included);
- attn:      the attention output;
- ln:        every LayerNorm output of the layers (the residual stream).

Per variant: agreement with eager INT8 (the compile guard's measure) on a padded batch of
real text with a 512-token document and on a batch of short sentences, the guard's noise floor
(eager vs itself with 1e-6 jitter), and the cosine vs FP32 of the mean-pooled embeddings of
SNLI sentences and the stress inputs (what a user's results depend on):

    python benchmarks/bf16_sites.py --snli-dir .cache/snli [--json out.json]
"""

from __future__ import annotations

import argparse
import copy
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from stress import embed_one, load_setup, stress_inputs

import squant
from squant.bench.report import format_table
from squant.data import tokenize
from squant.quant.attention import FusedSelfAttention
from squant.quant.mappings import max_positions, model_inputs
from squant.quant.qlinear import QuantLinear
from squant.runtime.compiler import agreement, first_tensor, noise_floor

SITES = ("weights", "emb", "gemm", "attn", "ln")


def _bf16(t: Tensor) -> Tensor:
    return t.to(torch.bfloat16).float()


def _round_output(module: nn.Module, args: Any, out: Any) -> Any:
    return _bf16(out) if isinstance(out, Tensor) else (_bf16(out[0]), *out[1:])


def with_bf16_storage(model: nn.Module, sites: set[str]) -> nn.Module:
    """A copy of the FP32 model whose values at `sites` are rounded to BF16 as stored."""
    model = copy.deepcopy(model)
    is_site: dict[str, Callable[[str, nn.Module], bool]] = {
        "emb": lambda n, m: isinstance(m, nn.LayerNorm) and "embeddings" in n,
        "gemm": lambda n, m: isinstance(m, QuantLinear),
        "attn": lambda n, m: isinstance(m, FusedSelfAttention),
        "ln": lambda n, m: isinstance(m, nn.LayerNorm) and "embeddings" not in n,
    }
    for name, module in model.named_modules():
        if "weights" in sites and isinstance(module, nn.LayerNorm | nn.Embedding):
            with torch.no_grad():
                for p in module.parameters(recurse=False):
                    p.copy_(_bf16(p))
        if any(is_site[s](name, module) for s in sites if s in is_site):
            module.register_forward_hook(_round_output)
    return model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--snli-dir", type=Path, default=Path(".cache/snli"))
    p.add_argument("--calib-size", type=int, default=256)
    p.add_argument("--sentences", type=int, default=150, help="SNLI sentences for the FP32 cosine")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    torch.manual_seed(0)
    model, tok, rows, sents = load_setup(args.snli_dir, args.calib_size)
    calibration = tokenize(tok, sents, 16, 128, coverage_length=max_positions(model))
    held_out = rows[args.calib_size :]
    texts = [
        held_out[0]["sentence1"],
        "",
        "dog",
        " ".join(r["sentence1"] for r in held_out[100:180]),  # a 512-token document
        "東京で寿司を食べた 🍣😀 Привет мир see https://example.com/a?q=1 def f(x): return x",
        held_out[1]["sentence2"],
    ]
    padded = model_inputs(model, tok(texts, padding=True, truncation=True, return_tensors="pt"))
    shorts = [r["sentence1"] for r in held_out[200:208]]
    short = model_inputs(model, tok(shorts, padding=True, return_tensors="pt"))
    for_fp32 = {
        **stress_inputs(held_out),
        **{f"snli {i}": r["sentence1"] for i, r in enumerate(held_out[300 : 300 + args.sentences])},
    }
    fp32 = {k: embed_one(model, tok, v) for k, v in for_fp32.items()}
    variants = {"eager INT8 (FP32 float parts)": set(), "all sites BF16": set(SITES)}
    variants |= {f"only {s} BF16": {s} for s in SITES}
    record: dict[str, Any] = {"sites": list(SITES), "results": {}}
    table = []
    for mode in ("static", "dynamic"):
        q = squant.quantize(model, squant.SmoothQuantConfig(mode=mode), calibration, progress=False)
        with torch.no_grad():
            ref_padded = first_tensor(q(**padded)).float()
            ref_short = first_tensor(q(**short)).float()
        floor = noise_floor(q, padded, ref_padded), noise_floor(q, short, ref_short)
        for name, sites in variants.items():
            m = with_bf16_storage(q, sites)
            with torch.no_grad():
                a_padded = agreement(
                    ref_padded, first_tensor(m(**padded)).float(), padded["attention_mask"]
                )
                a_short = agreement(
                    ref_short, first_tensor(m(**short)).float(), short["attention_mask"]
                )
            cos = {k: float(embed_one(m, tok, v) @ fp32[k]) for k, v in for_fp32.items()}
            snli = [c for k, c in cos.items() if k.startswith("snli")]
            stress = [c for k, c in cos.items() if not k.startswith("snli")]
            result = {
                "agreement_padded": a_padded,
                "agreement_short": a_short,
                "noise_floor_padded": floor[0],
                "noise_floor_short": floor[1],
                "fp32_cosine_snli_mean": sum(snli) / len(snli),
                "fp32_cosine_snli_min": min(snli),
                "fp32_cosine_stress_min": min(stress),
                "fp32_cosine": cos,
            }
            record["results"][f"{mode}: {name}"] = result
            row = [mode, name, f"{a_padded:.5f}", f"{a_short:.5f}", f"{floor[0]:.5f}"]
            row += [f"{result['fp32_cosine_snli_mean']:.5f}", f"{min(stress):.5f}"]
            table.append(row)
            print("  " + " | ".join(row), flush=True)
    headers = ["mode", "variant", "vs eager, padded", "vs eager, short", "noise floor"]
    print(format_table([*headers, "vs FP32, SNLI mean", "vs FP32, stress worst"], table))
    if args.json:
        from squant.provenance import write_result

        write_result(args.json, record)


if __name__ == "__main__":
    main()
