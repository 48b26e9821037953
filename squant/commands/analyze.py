"""`squant analyze`: hardware ceilings, roofline and hotspots of a model."""

from __future__ import annotations

import argparse
import sys

from ..runtime.shapes import fitted_shape
from .common import checked_threads, load_any, positive_int

HELP = "hardware ceilings, roofline and hotspots of a model"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="checkpoint directory or built-in config name (random weights)")
    p.add_argument("--batch", type=positive_int, default=1)
    p.add_argument(
        "--seq", type=positive_int, default=None, help="default: 256 or the model's positions"
    )
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
    p.add_argument("--png", default=None, help="write a roofline plot to this PNG file")
    p.add_argument(
        "--quick",
        action="store_true",
        help="measure the ceilings on a small GEMM for 0.1 s each (a rough look in seconds)",
    )


def run(args: argparse.Namespace) -> None:
    import json

    import torch

    from ..bench.analyze import analyze_model
    from ..files import check_output_file, write_output_file

    inputs = [args.model, args.bench]
    json_path = check_output_file(args.json, inputs, "--json") if args.json else None
    png_path = check_output_file(args.png, inputs, "--png") if args.png else None
    if checked_threads(args.threads):
        torch.set_num_threads(args.threads)
    model = load_any(args.model)
    args.batch, args.seq = fitted_shape(model, args.batch, args.seq)
    hotspots = [v.strip() for v in args.hotspots.split(",") if v.strip()]
    print(f"measuring this CPU ({torch.get_num_threads()} threads) ...", file=sys.stderr)
    analysis = analyze_model(
        model, args.model, args.batch, args.seq, hotspots, args.bench, quick=args.quick
    )
    print("\n" + "\n".join(analysis.lines()))
    if png_path:
        from ..bench.plots import roofline_png

        try:
            png = roofline_png(analysis.gemms, analysis.peaks, png_path, args.model)
            print(f"\nroofline plot: {png}")
        except ImportError:
            print("(matplotlib not installed: no plot; pip install 'squant[plot]')")
    if json_path:
        write_output_file(json_path, json.dumps(analysis.record(), indent=2, default=str))
        print(f"JSON: {args.json}")
