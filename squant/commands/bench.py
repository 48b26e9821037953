"""`squant bench`: throughput and latency of variants, N instances x C cores."""

from __future__ import annotations

import argparse

from ..runtime.shapes import fitted_shape
from .common import load_any, positive_float, positive_int

HELP = "throughput/latency of variants, multi-instance"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="checkpoint directory or built-in config name (random weights)")
    p.add_argument(
        "--variants",
        default="fp32-compiled,static-compiled,dynamic-compiled",
        help="comma list of PRECISION[-RUNTIME] (fp32|bf16|static|dynamic, -compiled or -pt2; "
        "no suffix: eager), as in squant eval",
    )
    p.add_argument("--batch", type=positive_int, default=1)
    p.add_argument(
        "--seq", type=positive_int, default=None, help="default: 256 or the model's positions"
    )
    p.add_argument("--instances", type=positive_int, default=None, help="default: cores / C")
    p.add_argument(
        "--cores-per-instance",
        type=positive_int,
        default=None,
        help="default: 4 (fewer on small hosts)",
    )
    p.add_argument(
        "--duration", type=positive_float, default=10.0, help="seconds of timed run per variant"
    )
    p.add_argument("--json", default=None)
    p.add_argument("--png", default=None, help="throughput bar chart")


def run(args: argparse.Namespace) -> None:
    import json

    from ..bench.compare import bench_variants
    from ..bench.configs import is_builtin
    from ..files import check_output_file, write_output_file
    from ..runtime.placement import plan

    json_path = check_output_file(args.json, [args.model], "--json") if args.json else None
    png_path = check_output_file(args.png, [args.model], "--png") if args.png else None
    placement = plan(args.instances, args.cores_per_instance)
    model = load_any(args.model)
    args.batch, args.seq = fitted_shape(model, args.batch, args.seq)
    weights = (
        "random weights (published config)" if is_builtin(args.model) else "checkpoint weights"
    )
    report = bench_variants(
        model, args.model, args.variants, placement, args.batch, args.seq, args.duration, weights
    )
    print("\n" + "\n".join(report.lines()))
    if json_path:
        write_output_file(json_path, json.dumps(report.record(), indent=2))
        print(f"JSON: {args.json}")
    if png_path:
        from ..bench.plots import bars_png

        tputs = {n: report.throughput(n) for n in report.results}
        shape = f"{placement.instances}x{placement.cores_per_instance}"
        title = f"{args.model}, bs {args.batch}, seq {args.seq}, {shape}"
        print(f"chart: {bars_png(tputs, png_path, title, 'sequences/s')}")
