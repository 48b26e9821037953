"""`squant analyze`: hardware ceilings, roofline and hotspots of a model."""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path
from typing import Any

from ..errors import SquantError
from .common import load_any, positive_int

HELP = "hardware ceilings, roofline and hotspots of a model"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="checkpoint directory or built-in config name (random weights)")
    p.add_argument("--batch", type=positive_int, default=1)
    p.add_argument("--seq", type=positive_int, default=256)
    p.add_argument(
        "--threads", type=positive_int, default=None, help="default: all of this process's"
    )
    p.add_argument("--bench", default=None, help="bench JSON for the realized-vs-ceiling table")
    p.add_argument(
        "--hotspots",
        default="fp32,static",
        help="precisions whose compiled model is profiled ('' = none)",
    )
    p.add_argument("--json", default=None)
    p.add_argument("--png", default="roofline.png", help="roofline plot ('' = none)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="measure the ceilings on a small GEMM for 0.1 s each (a rough look in seconds)",
    )


def run(args: argparse.Namespace) -> None:
    import json

    import torch

    from .. import analyze
    from ..bench.peaks import measure_peaks
    from ..hardware import cpu_features
    from ..report import format_table

    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_any(args.model)
    gemms = analyze.model_gemms(model.config, args.batch, args.seq)
    print(f"measuring this CPU ({torch.get_num_threads()} threads) ...", file=sys.stderr)
    peaks = measure_peaks(shape=(256, 1024, 1024), seconds=0.1) if args.quick else measure_peaks()
    cpu = cpu_features()
    record: dict[str, Any] = {"model": args.model, "batch": args.batch, "seq": args.seq}
    record["hardware"] = cpu.to_dict()
    record["peaks"] = peaks.to_dict()
    print(
        f"\n{cpu.model_name}: {cpu.physical_cores} cores, {len(cpu.numa_nodes)} NUMA node(s), ISA "
        f"{' '.join(cpu.isa)}; {peaks.threads} threads, clock {peaks.clock_ghz} GHz"
    )
    print(f"memory bandwidth (copy): {peaks.bandwidth_bytes_per_s / 1e9:.1f} GB/s\n")
    print(
        format_table(
            ["dtype", "measured GOP/s", "theoretical", "of peak", "balance ops/B"],
            analyze.peaks_table(peaks),
        )
    )
    print(
        f"\nGEMMs of one forward, batch {args.batch}, seq {args.seq} "
        "(arithmetic intensity, ops/byte)"
    )
    print(
        format_table(
            ["GEMM", "m x k x n", "count", "fp32", "bf16", "int8"], analyze.gemm_table(gemms)
        )
    )
    print("\nroofline-bound ms per forward (linear block)")
    print(
        format_table(
            ["GEMM", "fp32", "bf16", "int8", "int8 vs fp32", "int8 vs bf16"],
            analyze.roofline_table(gemms, peaks),
        )
    )
    other_ms = 0.0
    if args.hotspots:
        hot = _hotspots(model, args, [v.strip() for v in args.hotspots.split(",") if v.strip()])
        record["hotspots"] = hot
        rows = [
            [
                v,
                *(f"{h['percent'][c]:.1f}%" for c in ("linear", "attention", "layernorm", "other")),
                f"{h['ms']:.1f}",
            ]
            for v, h in hot.items()
        ]
        print("\nwhere the time goes (profiler, compiled model)")
        print(format_table(["variant", "linear", "attention", "layernorm", "other", "ms"], rows))
        int8_rows = [h for v, h in hot.items() if v in ("static", "dynamic")]
        if int8_rows:
            h = int8_rows[0]
            other_ms = h["ms"] * (100 - h["percent"]["linear"]) / 100
    record["ceilings"] = c = analyze.ceilings(gemms, peaks, other_ms)
    print(
        f"\nceilings: INT8 linear block {c['int8_vs_fp32_linear']:.2f}x FP32, "
        f"{c['int8_vs_bf16_linear']:.2f}x BF16; end to end with {other_ms:.1f} ms of non-GEMM work "
        f"{c['int8_vs_fp32_end_to_end']:.2f}x FP32, {c['int8_vs_bf16_end_to_end']:.2f}x BF16"
    )
    if args.bench:
        bench = analyze.read_bench(args.bench, args.model)
        rows = analyze.realized_vs_ceiling(bench, gemms, peaks)
        record["realized_vs_ceiling"] = rows
        print("\nrealized vs ceiling (linear-block roofline bound / measured forward)")
        print(
            format_table(["variant", "GEMM dtype", "measured ms", "bound ms", "of ceiling"], rows)
        )
    if args.png:
        from ..bench.plots import roofline_png

        try:
            print(f"\nroofline plot: {roofline_png(gemms, peaks, args.png, args.model)}")
        except ImportError:
            print("(matplotlib not installed: no plot; pip install 'squant[plot]')")
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=2, default=str))
        print(f"JSON: {args.json}")


def _hotspots(model: Any, args: argparse.Namespace, variants: list[str]) -> dict[str, Any]:
    import torch

    from ..bench.configs import random_calibration, random_inputs
    from ..bench.hotspots import breakdown, profile
    from ..timing import measure
    from ..variants import BuildContext, Variant, build, parse_variants

    inputs = random_inputs(model, args.batch, args.seq)
    # random tokens are enough to place the time; accuracy is not measured here
    context = BuildContext(
        random_calibration(model), example_inputs=inputs, kernel_profile=True, progress=False
    )
    out = {}
    for v in parse_variants(variants):
        if v.runtime == "pt2":
            raise SquantError(f"--hotspots profiles compiled models; {v.name} is a package")
        v = Variant(v.precision, "compiled")  # a bare precision means its compiled model
        torch._dynamo.reset()
        compiled = build(v, model, context)
        run = functools.partial(compiled, **inputs)
        times = profile(run)
        ms = measure(run, min_seconds=1.0).median_ms
        out[v.precision] = {"percent": breakdown(times), "ms": ms}
    return out
