"""`squant tune`: the fastest INT8 configuration within an accuracy-loss budget."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .common import positive_int

HELP = "pick mode/alpha (and float fallbacks) to stay within an accuracy-loss budget"


def _percent(text: str) -> float:
    try:
        return float(text.rstrip("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a percentage like 0.5%, got {text!r}") from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..eval.runner import TASKS

    p.add_argument("model", help="local checkpoint directory")
    p.add_argument("--task", required=True, choices=TASKS)
    p.add_argument("--data", required=True)
    p.add_argument("--train", default=None, help="probe only: labelled pairs to fit the probe")
    p.add_argument("--calib", default=None)
    p.add_argument("--limit", type=positive_int, default=None)
    p.add_argument(
        "--max-loss", type=_percent, default=0.5, help="relative loss budget, e.g. 0.5%%"
    )
    p.add_argument("--max-fallback", type=positive_int, default=12)
    p.add_argument(
        "--metric", default=None, help="metric the budget applies to (default: the task's first)"
    )
    p.add_argument(
        "--measure-speed",
        type=int,
        default=0,
        metavar="SEQ",
        help="also time each fallback step compiled, at batch 1 x SEQ tokens (0 = don't)",
    )
    p.add_argument("--out", required=True, help="directory for the chosen quantized model")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace --out even when it holds files squant did not write",
    )
    p.add_argument(
        "--json", default=None, help="report of everything tried (default: OUT/tune.json)"
    )


def _speed_meter(model, seq: int):
    """ms per compiled forward at batch 1 x seq, or None when not asked for."""
    if seq <= 0:
        return None
    import torch

    from ..bench.configs import random_inputs
    from ..compiler import CompileConfig, compile
    from ..timing import measure

    inputs = random_inputs(model, 1, seq)

    def meter(qmodel) -> float:
        torch._dynamo.reset()
        # timing only (random tokens): the numerics check is loose on purpose
        compiled = compile(qmodel, CompileConfig(min_cosine=0.9), inputs)
        return measure(lambda: compiled(**inputs), min_seconds=1.0).median_ms

    return meter


def run(args: argparse.Namespace) -> None:
    from ..eval.runner import prepare_task
    from ..files import check_output_dir
    from ..models import load_tokenizer
    from ..report import format_table
    from ..serialization import CONFIG_FILE, save
    from ..tune import TuneConfig, tune

    check_output_dir(args.out, CONFIG_FILE, [args.model], args.overwrite)
    task = prepare_task(args.model, args.task, args.data, args.limit, args.calib, args.train)
    config = TuneConfig(max_loss=args.max_loss, max_fallback=args.max_fallback, metric=args.metric)
    result = tune(task, config, _speed_meter(task.model, args.measure_speed))
    report = result["report"]
    save(
        result["model"],
        args.out,
        tokenizer=load_tokenizer(args.model),
        overwrite=args.overwrite,
        protect=(args.model,),
    )
    path = Path(args.json) if args.json else Path(args.out) / "tune.json"
    path.write_text(json.dumps(report, indent=2))
    m = report["metric"]
    others = [x for x in task.metrics if x != m]
    rows = [
        [
            t["config"]["mode"],
            t["config"]["alpha"],
            len(t["config"]["exclude"]),
            f"{t[m]:.5f}",
            *(f"{t[x]:.5f}" for x in others),
            f"{t['loss_percent']:+.3f}%",
            "yes" if t["within_budget"] else "no",
        ]
        for t in report["tried"]
    ]
    print(f"FP32 {m}: {report['fp32']:.5f}; budget {args.max_loss}% relative loss")
    print(format_table(["mode", "alpha", "float linears", m, *others, "loss", "within"], rows))
    for f in report["fallbacks"]:
        speed = (
            f" {f['ms']:.1f} ms ({f['slowdown_vs_full_int8']:.2f}x full INT8)" if "ms" in f else ""
        )
        print(
            f"fell back {f['fell_back']} (sensitivity {f['sensitivity']:.4f}): "
            f"loss {f['loss_percent']:+.3f}%{speed}"
        )
    verdict = "within budget" if report["within_budget"] else "OVER budget (best found saved)"
    print(
        f"chosen: {report['chosen']['mode']}, alpha {report['chosen']['alpha']}, "
        f"{len(report['chosen']['exclude'])} linear(s) in float -> {args.out} ({verdict}); "
        f"report {path}"
    )
