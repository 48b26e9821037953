"""The `squant` command line. Each subcommand is (add_arguments, run) in COMMANDS."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .config import ACT_RANGES, MODES, SmoothQuantConfig
from .errors import SquantError

CONFIG_HELP = {
    "mode": "static: per-tensor activation scales from calibration; dynamic: per-token at run time",
    "alpha": "SmoothQuant migration strength in [0, 1] (0 = no smoothing), or 'auto' to search "
    "it per layer",
    "act_range": "static activation range: calibrated min/max, or a percentile of a histogram",
    "percentile": "percentile kept by --act-range percentile",
    "exclude": "module-name pattern to keep in float (repeatable), e.g. '*.layer.5.output.dense'",
    "search_tokens": "calibration tokens sampled per linear by --alpha auto",
}


def _alpha(text: str) -> float | str:
    if text == "auto":
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or 'auto', got {text!r}") from None


FIELD_TYPES: dict[str, Callable[[str], Any]] = {
    "alpha": _alpha,
    "percentile": float,
    "search_tokens": int,
}


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per SmoothQuantConfig field, defaults taken from the dataclass."""
    for field in dataclasses.fields(SmoothQuantConfig):
        flag = "--" + field.name.replace("_", "-")
        default = field.default
        if field.name == "exclude":
            parser.add_argument(flag, action="append", default=[], help=CONFIG_HELP[field.name])
            continue
        choices = {"mode": MODES, "act_range": ACT_RANGES}.get(field.name)
        kind = FIELD_TYPES.get(field.name, str)
        parser.add_argument(
            flag, type=kind, default=default, choices=choices, help=CONFIG_HELP[field.name]
        )


def config_from_args(args: argparse.Namespace) -> SmoothQuantConfig:
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(SmoothQuantConfig)}
    values["exclude"] = tuple(values["exclude"])
    return SmoothQuantConfig(**values)


# ---------------------------------------------------------------- quantize
def _add_quantize(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", help="local Hugging Face checkpoint directory")
    p.add_argument("--calib", required=True, help="calibration texts (.txt, .tsv or .jsonl)")
    p.add_argument("--out", required=True, help="output directory for the quantized model")
    p.add_argument("--task", default="auto", help="head to load (auto = the checkpoint's own)")
    p.add_argument("--calib-size", type=int, default=256, help="texts used for calibration")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument(
        "--max-length",
        type=int,
        default=None,
        help="tokens per calibration text (default: 128, or the model's limit if smaller)",
    )
    add_config_arguments(p)


def _run_quantize(args: argparse.Namespace) -> None:
    from . import data, models
    from .mappings import max_positions
    from .quantize import quantize
    from .serialization import save

    config = config_from_args(args)
    if args.calib_size < 1:
        raise SquantError(f"--calib-size must be >= 1, got {args.calib_size}")
    texts = data.read_texts(args.calib, limit=args.calib_size)
    model = models.load_model(args.checkpoint, args.task)
    limit = max_positions(model)
    max_length = args.max_length or min(128, limit)
    if max_length > limit:
        raise SquantError(f"--max-length {max_length} exceeds the model's {limit} positions")
    tokenizer = models.load_tokenizer(args.checkpoint)
    batches = data.tokenize(tokenizer, texts, args.batch_size, max_length)
    qmodel = quantize(model, config, batches, inplace=True)
    out = save(qmodel, args.out, tokenizer=tokenizer)
    n = len(qmodel.squant_info["modules"])
    size = sum(f.stat().st_size for f in Path(out).glob("*.safetensors")) / 2**20
    print(
        f"quantized {n} linears of {type(qmodel).__name__} ({config.mode}, alpha={config.alpha}) "
        f"with {len(texts)} calibration texts -> {out} ({size:.1f} MiB)"
    )


COMMANDS: dict[str, tuple[str, Callable[[Any], None], Callable[[Any], None]]] = {
    "quantize": ("SmoothQuant INT8 a checkpoint and save it", _add_quantize, _run_quantize),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="squant", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (help_text, add, _run) in COMMANDS.items():
        add(sub.add_parser(name, help=help_text, description=help_text))
    return parser


def main(argv: list[str] | None = None) -> int:
    # squant reads local directories only; never wait on a model hub.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # transformers imports torchao, which logs about CUDA-only kernels it cannot load on a CPU.
    for noisy in ("torchao", "torch.utils._pytree"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    import transformers

    transformers.utils.logging.disable_progress_bar()  # squant shows its own progress
    args = build_parser().parse_args(argv)
    try:
        COMMANDS[args.command][2](args)
    except SquantError as e:
        print(f"squant {args.command}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
