"""The `squant` command line: one module per subcommand in squant/commands."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from .commands import analyze, bench, evaluate, quantize, tune
from .errors import SquantError

COMMANDS = {
    "quantize": quantize,
    "eval": evaluate,
    "tune": tune,
    "analyze": analyze,
    "bench": bench,
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="squant", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, command in COMMANDS.items():
        command.add_arguments(sub.add_parser(name, help=command.HELP, description=command.HELP))
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
        COMMANDS[args.command].run(args)
    except SquantError as e:
        print(f"squant {args.command}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
