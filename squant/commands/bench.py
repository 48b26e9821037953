"""`squant bench`: throughput and latency of variants, N instances x C cores."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..errors import SquantError
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
    p.add_argument("--seq", type=positive_int, default=256)
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
    import platform

    import torch
    from tqdm.auto import tqdm

    from ..bench import runner
    from ..bench.configs import is_builtin, random_calibration, random_inputs
    from ..hardware import cpu_features
    from ..report import format_table
    from ..variants import BuildContext, build, parse_variants

    variants = [v.name for v in parse_variants(args.variants)]
    placement = runner.plan(args.instances, args.cores_per_instance)
    model = load_any(args.model)
    from ..mappings import max_positions

    if args.seq > max_positions(model):
        raise SquantError(f"--seq {args.seq} exceeds the model's {max_positions(model)} positions")
    inputs = random_inputs(model, args.batch, args.seq)
    calibration = random_calibration(model, seq=min(args.seq, 128))
    weights = (
        "random weights (published config)" if is_builtin(args.model) else "checkpoint weights"
    )
    results: dict[str, Any] = {}
    memory_one: dict[str, Any] = {}
    for name in tqdm(variants, desc="variants"):
        torch._dynamo.reset()
        context = BuildContext(
            calibration, example_inputs=inputs, instances=placement.instances, progress=False
        )
        compiled = build(name, model, context)
        fn = lambda c=compiled: c(**inputs)  # noqa: E731
        if name == variants[-1] and placement.instances > 1:
            single = runner.Placement(1, placement.cores_per_instance, placement.cores[:1])
            memory_one = runner.run(fn, single, duration_s=min(args.duration, 3.0))["memory"]
        results[name] = runner.run(fn, placement, duration_s=args.duration, batch=args.batch)
    # the float baselines a ratio is taken against: the compiled one when both were run
    fp32, bf16 = (
        next((results[n]["sequences_per_s"] for n in (f"{p}-compiled", p) if n in results), None)
        for p in ("fp32", "bf16")
    )
    rows = []
    for name, r in results.items():
        worst = max((lat for lat in r["latency"] if lat), key=lambda lat: lat["median_ms"])
        tput = r["sequences_per_s"]
        rows.append(
            [
                name,
                f"{r['instances']}x{r['cores_per_instance']}",
                f"{tput:.1f}",
                f"{worst['median_ms']:.1f}",
                f"{worst['p90_ms']:.1f}",
                f"{worst['p99_ms']:.1f}",
                f"{tput / fp32:.2f}x" if fp32 else None,
                f"{tput / bf16:.2f}x" if bf16 else None,
            ]
        )
    print(
        f"\n{args.model} ({weights}), batch {args.batch}, seq {args.seq}; "
        f"{placement.instances} instance(s) x {placement.cores_per_instance} core(s), "
        f"cores {placement.cores}"
    )
    print(
        format_table(
            ["variant", "N x C", "seq/s (all)", "p50 ms", "p90 ms", "p99 ms", "vs FP32", "vs BF16"],
            rows,
        )
    )
    last = results[variants[-1]]["memory"]
    if memory_one and last:
        print(
            f"memory of the process ({variants[-1]}): 1 instance "
            f"{memory_one.get('pss_kib', 0) / 1024:.0f} MiB PSS, {placement.instances} instances "
            f"{last.get('pss_kib', 0) / 1024:.0f} MiB PSS (one shared model)"
        )
    record = {
        "benchmark": "squant bench",
        "model": args.model,
        "weights": weights,
        "batch": args.batch,
        "seq": args.seq,
        "instances": placement.instances,
        "cores_per_instance": placement.cores_per_instance,
        "duration_s": args.duration,
        "variants": variants,
        "results": results,
        "memory_one_instance": memory_one,
        "versions": {"torch": torch.__version__, "python": platform.python_version()},
        "hardware": cpu_features().to_dict(),
    }
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(record, indent=2))
        print(f"JSON: {args.json}")
    if args.png:
        from ..bench.plots import bars_png

        tputs = {n: r["sequences_per_s"] for n, r in results.items()}
        shape = f"{placement.instances}x{placement.cores_per_instance}"
        title = f"{args.model}, bs {args.batch}, seq {args.seq}, {shape}"
        print(f"chart: {bars_png(tputs, args.png, title, 'sequences/s')}")
