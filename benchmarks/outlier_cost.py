"""What the float outlier channels cost (SmoothQuantConfig.outlier_channels).

    python benchmarks/outlier_cost.py [--model distilbert-base-uncased] [--seq 256] [--rounds 30]

The named architecture with random weights (speed does not depend on values), quantized
in static (squant's default: Q|K|V and FFN-in static, the other two per token) and dynamic
mode without outlier channels, with them at FFN-out, at the mode's default sites (static:
FFN-out; dynamic: Q|K|V, FFN-in, FFN-out, with alpha 0) and at every site, each compiled
by squant.compile with one attention implementation for all (its "auto" choice is a timing
and may differ between builds, which would swamp the difference). All variants are built
first, then timed in interleaved rounds in one process, so drift hits all alike; the table
gives medians and the speed relative to the same mode without outlier channels.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import squant
from squant.bench.configs import random_calibration, random_inputs, random_model
from squant.bench.report import format_table
from squant.runtime.compiler import CompileConfig


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="distilbert-base-uncased")
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--attention", default="sdpa", choices=("sdpa", "squant"))
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    model = random_model(args.model)
    calibration = random_calibration(model)
    layouts = {
        "none": {"outlier_channels": 0},
        "ffn_out": {"outlier_sites": ("ffn_out",)},
        "mode defaults": {},
        "every site": {"outlier_sites": ("qkv", "attn_out", "ffn_in", "ffn_out")},
    }
    built = {}
    for mode in ("static", "dynamic"):
        seen = []
        for k, options in layouts.items():
            config = squant.SmoothQuantConfig(mode=mode, **options)
            if config in seen:  # static's defaults are its ffn_out layout
                continue
            seen.append(config)
            q = squant.quantize(model, config, calibration, progress=False)
            inputs = random_inputs(q, args.batch, args.seq)
            torch._dynamo.reset()
            compile_config = CompileConfig(attention=args.attention)
            built[(mode, k)] = squant.compile(q, compile_config, inputs)
    ms: dict[tuple[str, str], list[float]] = {v: [] for v in built}
    with torch.no_grad():
        for c in built.values():
            c(**inputs)
        for _ in range(args.rounds):
            for v, c in built.items():
                t0 = time.perf_counter()
                c(**inputs)
                ms[v].append(1e3 * (time.perf_counter() - t0))
    med = {v: statistics.median(t) for v, t in ms.items()}
    rows = [
        [mode, k, f"{med[(mode, k)]:.1f}", f"{med[(mode, 'none')] / med[(mode, k)]:.3f}x"]
        for mode, k in built
    ]
    print(
        f"{args.model}, compiled, bs {args.batch}, seq {args.seq}, "
        f"{torch.get_num_threads()} threads, {args.rounds} interleaved rounds, "
        f"attention {args.attention}"
    )
    print(format_table(["mode", "outlier channels at", "median ms", "speed vs none"], rows))
    if args.json:
        record = {
            "model": args.model,
            "batch": args.batch,
            "seq": args.seq,
            "threads": torch.get_num_threads(),
            "attention": args.attention,
            "rounds": args.rounds,
            "median_ms": {f"{m}/{k}": v for (m, k), v in med.items()},
        }
        args.json.write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
