"""`squant tune`: the fastest INT8 configuration within an accuracy-loss budget."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

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
    p.add_argument("--data", required=True, help="as for squant eval (files or a dataset)")
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


def _speed_meter(model: Any, seq: int) -> Callable[[Any], float] | None:
    """ms per compiled forward at batch 1 x seq, or None when not asked for."""
    if seq <= 0:
        return None
    import torch

    from ..bench.configs import random_inputs
    from ..runtime.compiler import CompileConfig, compile
    from ..runtime.timing import measure

    inputs = random_inputs(model, 1, seq)

    def meter(qmodel: Any) -> float:
        torch._dynamo.reset()
        # timing only (random tokens): the numerics check is loose on purpose
        compiled = compile(qmodel, CompileConfig(min_cosine=0.9), inputs)
        return measure(lambda: compiled(**inputs), min_seconds=1.0).median_ms

    return meter


def run(args: argparse.Namespace) -> None:
    from ..checkpoint.models import load_tokenizer
    from ..checkpoint.serialization import CONFIG_FILE, save
    from ..eval.runner import prepare_task
    from ..eval.tune import TuneConfig, tune
    from ..files import check_output_dir, check_output_file, write_output_file

    check_output_dir(args.out, CONFIG_FILE, [args.model], args.overwrite)
    json_path = (
        check_output_file(args.json, [args.model, args.out], "--json") if args.json else None
    )
    task = prepare_task(args.model, args.task, args.data, args.limit, args.calib, args.train)
    config = TuneConfig(max_loss=args.max_loss, max_fallback=args.max_fallback, metric=args.metric)
    result = tune(task, config, _speed_meter(task.model, args.measure_speed))
    report = json.dumps(result.to_dict(), indent=2)
    save(
        result.model,
        args.out,
        tokenizer=load_tokenizer(args.model),
        overwrite=args.overwrite,
        protect=(args.model,),
        extra_files=None if json_path else {"tune.json": report},
    )
    path = json_path or Path(args.out) / "tune.json"
    if json_path:
        write_output_file(json_path, report)
    print("\n".join(result.lines()))
    print(f"saved -> {args.out}; report {path}")
