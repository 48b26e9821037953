"""The attention block alone: squant's int8 kernel against PyTorch's SDPA at encoder shapes.

Both read the fused Q|K|V projection's output [B, S, 3·H·D] and return [B, S, H·D] (SDPA with
the head transposes a model does around it), with every key valid. Each kernel path this CPU
runs is timed, in interleaved rounds in one process; ratios are per round, then the median:

    python benchmarks/attention_kernel.py [--shapes 1x128x12x32,1x256x12x64] [--json out.json]

Shapes are BxSxHxD: all-MiniLM-L6-v2 is H=12, D=32; BERT-base, DistilBERT and XLM-R are
H=12, D=64; BERT-large H=16, D=64.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from squant import kernels
from squant.bench.report import format_table
from squant.hardware import cpu_features
from squant.provenance import commit, versions

DEFAULT_SHAPES = "1x128x12x32,8x128x12x32,32x128x12x32,1x256x12x64,8x128x12x64,1x256x16x64"


def runners(b: int, s: int, h: int, d: int) -> dict:
    torch.manual_seed(0)
    qkv = torch.randn(b, s, 3 * h * d)
    mask = torch.ones(b, s, dtype=torch.bool)

    def sdpa() -> torch.Tensor:
        q, k, v = qkv.view(b, s, 3, h, d).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, s, h * d)

    out = {"sdpa (fp32)": sdpa}
    for isa in kernels.supported_isas():
        if isa != "scalar":
            out[f"squant int8 ({isa})"] = lambda isa=isa: torch.ops.squant.int8_attention(
                qkv, mask, h, d**-0.5, isa
            )
    return out


def time_once(fn, seconds: float) -> float:
    fn()
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        fn()
        n += 1
    return (time.perf_counter() - start) / n * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--shapes", default=DEFAULT_SHAPES, help="comma list of BxSxHxD")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--seconds", type=float, default=0.3, help="per variant per round")
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    kernels.load()
    record: dict = {
        "benchmark": "attention block alone (interleaved rounds, one process)",
        "command": "python benchmarks/attention_kernel.py " + " ".join(sys.argv[1:]),
        "commit": commit(),
        "threads": args.threads,
        "versions": versions(),
        "hardware": cpu_features().to_dict(),
        "results": {},
    }
    table = []
    with torch.no_grad():
        for shape in args.shapes.split(","):
            b, s, h, d = (int(x) for x in shape.lower().split("x"))
            fns = runners(b, s, h, d)
            times: dict[str, list[float]] = {k: [] for k in fns}
            for _ in range(args.rounds):
                for name, fn in fns.items():
                    times[name].append(time_once(fn, args.seconds))
            ref = times["sdpa (fp32)"]
            row = {}
            for name, ts in times.items():
                ratio = statistics.median(t / r for t, r in zip(ts, ref, strict=True))
                row[name] = {"median_ms": statistics.median(ts), "vs_sdpa": ratio}
                table.append([shape, name, f"{statistics.median(ts):.3f}", f"{ratio:.2f}x"])
            record["results"][shape] = row
    print(format_table(["B x S x H x D", "kernel", "ms p50", "time vs sdpa"], table))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
