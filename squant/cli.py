"""The `squant` command line: one module per subcommand in squant/commands."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import NoReturn

from .commands import analyze, bench, embed, evaluate, export, quantize, serve, tune
from .errors import SquantError

COMMANDS = {
    "quantize": quantize,
    "export": export,
    "eval": evaluate,
    "tune": tune,
    "analyze": analyze,
    "bench": bench,
    "serve": serve,
    "embed": embed,
}


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (`squant CMD: error: ...`) and exit code 2,
    like every other squant error; --help still prints the full usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="squant", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
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
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # --help (0) or a usage error (2), already printed
        return int(e.code or 0)
    # the invocation, as results record it (provenance)
    args.command_line = ["squant", *(sys.argv[1:] if argv is None else argv)]
    try:
        COMMANDS[args.command].run(args)
    except SquantError as e:
        print(f"squant {args.command}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
