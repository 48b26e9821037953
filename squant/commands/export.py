"""`squant export`: a checkpoint to a deploy directory (AOTInductor package) in one command."""

from __future__ import annotations

import argparse

from ..errors import SquantError
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
    import time
    from pathlib import Path

    from ..checkpoint import models
    from ..checkpoint.pipeline import quantize_checkpoint, weights_mib
    from ..checkpoint.source import load_encoder, source_kind
    from ..files import check_output_dir
    from ..runtime.export import MANIFEST, MAX_BATCH, ExportConfig, export

    config: ExportConfig = dataclass_from_args(ExportConfig, args)
    source = Path(args.source)
    quantized_dir = source_kind(source) == "quantized"
    if not quantized_dir:
        source = models.resolve(args.source)
        models.load_config(source)
        if args.calib is None:
            raise SquantError(
                f"{args.source} is a float checkpoint: pass --calib TEXTS to quantize it, or "
                "export a directory written by squant quantize"
            )
    check_output_dir(args.out, MANIFEST, [source], args.overwrite)
    if quantized_dir:
        model = load_encoder(source)
        tokenizer = models.load_tokenizer(source)
    else:
        qconfig = config_from_args(args)
        result = quantize_checkpoint(
            source, args.calib, qconfig, calibration_settings(args), args.task
        )
        print(*result.report.lines(), sep="\n")
        model, tokenizer = result.encoder, result.tokenizer
    before = weights_mib(source)
    t0 = time.perf_counter()
    package = export(model, args.out, None, tokenizer, config, overwrite=args.overwrite)
    batch = f"1..{MAX_BATCH}" if args.dynamic_batch else args.batch
    shape = f"{batch} x {'2..max' if args.dynamic_seq else args.seq}"
    print(
        f"exported {type(model).__name__} for [{shape}] in {time.perf_counter() - t0:.0f} s -> "
        f"{package} ({weights_mib(package.parent):.1f} MiB; weights before {before:.1f} MiB)"
    )
