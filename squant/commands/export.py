"""`squant export`: a checkpoint to a deploy directory (AOTInductor package) in one command."""

from __future__ import annotations

import argparse

from .common import (
    add_config_arguments,
    add_dataclass_arguments,
    config_from_args,
    dataclass_from_args,
    positive_int,
)
from .quantize import add_calibration_arguments, calibration_settings

HELP = "build a deploy directory (.pt2 package + manifest + tokenizer) from a checkpoint"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "source",
        help="a directory written by squant quantize / squant.save, or a float checkpoint "
        "(directory or Hub id; then --calib quantizes it first)",
    )
    p.add_argument("--out", required=True, help="the deploy directory to write")
    p.add_argument("--calib", default=None, help="calibration texts (float checkpoints only)")
    from ..runtime.export import ExportConfig

    add_dataclass_arguments(p, ExportConfig, {"batch": positive_int, "seq": positive_int})
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    p.add_argument("--task", default="auto", help="head to load (auto = the checkpoint's own)")
    add_calibration_arguments(p)
    add_config_arguments(p)


def run(args: argparse.Namespace) -> None:
    from ..checkpoint.pipeline import export_checkpoint, weights_mib
    from ..runtime.export import MAX_BATCH, ExportConfig

    config: ExportConfig = dataclass_from_args(ExportConfig, args)
    result = export_checkpoint(
        args.source,
        args.out,
        args.calib,
        config_from_args(args),
        calibration_settings(args),
        args.task,
        config,
        args.overwrite,
        say=print,
    )
    batch = f"1..{MAX_BATCH}" if args.dynamic_batch else args.batch
    shape = f"{batch} x {'2..max' if args.dynamic_seq else args.seq}"
    print(
        f"exported {result.model_class} for [{shape}] in {result.seconds:.0f} s -> "
        f"{result.package} ({weights_mib(result.package.parent):.1f} MiB; weights before "
        f"{weights_mib(result.source):.1f} MiB)"
    )
