"""`squant quantize`: SmoothQuant INT8 a checkpoint and save it."""

from __future__ import annotations

import argparse
from typing import Any

from .common import add_config_arguments, config_from_args, positive_int

HELP = "SmoothQuant INT8 a checkpoint and save it"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "checkpoint",
        help="Hugging Face checkpoint: a local directory or a Hub id (sentence-transformers "
        "directories keep their pooling and normalisation)",
    )
    p.add_argument("--calib", required=True, help="calibration texts (.txt, .tsv or .jsonl)")
    p.add_argument("--out", required=True, help="output directory for the quantized model")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace --out even when it holds files squant did not write",
    )
    p.add_argument("--task", default="auto", help="head to load (auto = the checkpoint's own)")
    add_calibration_arguments(p)
    add_config_arguments(p)


def add_calibration_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--calib-size", type=positive_int, default=256, help="texts used for calibration"
    )
    p.add_argument("--batch-size", type=positive_int, default=16)
    p.add_argument(
        "--max-length",
        type=positive_int,
        default=None,
        help="tokens per calibration text (default: 128, or the model's limit if smaller)",
    )
    p.add_argument(
        "--coverage-length",
        type=positive_int,
        default=None,
        help="also calibrate on empty/1-5-word inputs and on the texts packed into documents of "
        "this many tokens (default: the model's limit)",
    )
    p.add_argument("--no-coverage", action="store_true", help="calibrate on the given texts only")


def calibration_settings(args: argparse.Namespace) -> Any:
    from ..checkpoint.pipeline import CalibrationSettings

    return CalibrationSettings(
        size=args.calib_size,
        batch_size=args.batch_size,
        max_length=args.max_length,
        coverage=not args.no_coverage,
        coverage_length=args.coverage_length,
    )


def run(args: argparse.Namespace) -> None:
    from ..checkpoint import models
    from ..checkpoint.pipeline import quantize_checkpoint, weights_mib
    from ..checkpoint.serialization import CONFIG_FILE, save
    from ..files import check_output_dir

    config = config_from_args(args)
    checkpoint = models.resolve(args.checkpoint)  # a Hub id becomes its cache folder
    models.load_config(checkpoint)  # a bad checkpoint is named before a bad --out
    # every reason the output would be refused, found before minutes of calibration
    check_output_dir(args.out, CONFIG_FILE, [checkpoint], args.overwrite)
    result = quantize_checkpoint(
        checkpoint, args.calib, config, calibration_settings(args), args.task
    )
    out = save(
        result.model,
        args.out,
        tokenizer=result.tokenizer,
        overwrite=args.overwrite,
        protect=(checkpoint,),
    )
    result.report.size_mib["after"] = weights_mib(out)
    print(*result.report.lines(), sep="\n")
    st = result.model is not result.encoder
    print(f"-> {out}" + (" (a SentenceTransformer: load it with squant.load)" if st else ""))
