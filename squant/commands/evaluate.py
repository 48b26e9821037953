"""`squant eval`: score FP32/BF16/INT8 variants of a checkpoint on a task."""

from __future__ import annotations

import argparse

from .common import parse_alpha, positive_int

HELP = "score FP32/BF16/INT8 variants of a checkpoint on a task"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..eval.runner import TASKS

    p.add_argument("model", help="local checkpoint directory")
    p.add_argument("--task", required=True, choices=TASKS)
    p.add_argument(
        "--data",
        required=True,
        help="the examples to score: SQuAD JSON, JSONL, TSV, or a Hugging Face dataset "
        "(a save_to_disk directory or a Hub id like glue/mnli, with :SPLIT to pick a split)",
    )
    p.add_argument(
        "--variants",
        default="fp32,static,dynamic",
        help="comma list of PRECISION[-RUNTIME]: fp32|bf16|static|dynamic, optionally -compiled "
        "(squant.compile) or -pt2 (the exported package), e.g. fp32,static,static-pt2",
    )
    p.add_argument(
        "--alpha", type=parse_alpha, default=None, help="default: auto (static), 0 (dynamic)"
    )
    p.add_argument(
        "--limit", type=positive_int, default=None, help="score only the first N examples"
    )
    p.add_argument("--calib", default=None, help="calibration texts (default: held-apart data)")
    p.add_argument("--calib-size", type=positive_int, default=128)
    p.add_argument("--train", default=None, help="probe only: labelled pairs to fit the probe")
    p.add_argument("--batch-size", type=positive_int, default=16)
    p.add_argument("--json", default=None, help="write the full record here")


def run(args: argparse.Namespace) -> None:
    import json

    from ..bench.report import format_table
    from ..eval.runner import EvalSettings, evaluate, format_results
    from ..files import check_output_file, write_output_file

    inputs = [args.model, args.data, args.calib, args.train]
    json_path = check_output_file(args.json, inputs, "--json") if args.json else None
    settings = EvalSettings(batch_size=args.batch_size, calib_size=args.calib_size)
    record = evaluate(
        args.model,
        args.task,
        args.data,
        args.variants,
        args.alpha,
        args.limit,
        args.calib,
        args.train,
        settings,
    )
    headers = ["variant", *record["metrics"], "loss vs fp32"]
    alpha = "each mode's default" if args.alpha is None else args.alpha
    print(f"{args.task} on {record['n_scored']} examples of {args.data}; alpha={alpha}")
    print(format_table(headers, format_results(record)))
    if json_path:
        from ..provenance import provenance

        record = {**record, "provenance": provenance(getattr(args, "command_line", None))}
        write_output_file(json_path, json.dumps(record, indent=2))
        print(f"JSON: {args.json}")
