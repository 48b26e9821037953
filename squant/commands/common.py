"""Argument helpers shared by the subcommands."""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..quant.config import ACT_RANGES, ATTENTION_KINDS, MODES, SITE_KINDS, SmoothQuantConfig

CONFIG_HELP = {
    "mode": "static: per-tensor activation scales from calibration; dynamic: per-token at run time",
    "alpha": "SmoothQuant migration strength in [0, 1] (0 = no smoothing), or 'auto' to search "
    "it per layer (default: auto for static, 0 for dynamic)",
    "act_range": "static activation range: calibrated min/max, or a percentile of a histogram",
    "percentile": "percentile kept by --act-range percentile",
    "exclude": "module-name pattern to keep in float (repeatable), e.g. '*.layer.5.output.dense'",
    "search_tokens": "calibration tokens sampled per linear by --alpha auto",
    "dynamic_sites": "with --mode static, a GEMM kind quantized per token at run time instead "
    "(repeatable: qkv, attn_out, ffn_in, ffn_out; 'none' = all static; default attn_out and "
    "ffn_out)",
    "outlier_channels": "input channels per linear (the largest calibrated ones) multiplied in "
    "float beside the int8 GEMM; 0 = none",
    "outlier_sites": "a GEMM kind that gets --outlier-channels (repeatable; 'none' = no site; "
    "default ffn_out for static, qkv, ffn_in and ffn_out for dynamic)",
    "alpha_max": "the largest alpha --alpha auto may choose",
    "attention": "int8: squant's C++ attention kernel (Q·Kᵀ in int8; built once on first use, "
    "needs a C++ compiler); float: attention in floating point; auto: int8 where the kernel "
    "builds, else float with a warning",
}


def parse_alpha(text: str) -> float | str:
    if text == "auto":
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or 'auto', got {text!r}") from None


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (0 never silently means "default")."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def port_number(text: str) -> int:
    """argparse type: a TCP port, 1..65535."""
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"expected a port in 1..65535, got {value}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return value


FIELD_TYPES: dict[str, Callable[[str], Any]] = {
    "alpha": parse_alpha,
    "percentile": float,
    "search_tokens": int,
    "outlier_channels": int,
    "alpha_max": float,
}


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per SmoothQuantConfig field, defaults taken from the dataclass."""
    for field in dataclasses.fields(SmoothQuantConfig):
        flag = "--" + field.name.replace("_", "-")
        default = field.default
        if field.name in ("exclude", "dynamic_sites", "outlier_sites"):
            choices = None if field.name == "exclude" else (*SITE_KINDS, "none")
            parser.add_argument(
                flag, action="append", default=None, choices=choices, help=CONFIG_HELP[field.name]
            )
            continue
        choices = {"mode": MODES, "act_range": ACT_RANGES, "attention": ATTENTION_KINDS}.get(
            field.name
        )
        kind = FIELD_TYPES.get(field.name, str)
        parser.add_argument(
            flag, type=kind, default=default, choices=choices, help=CONFIG_HELP[field.name]
        )


def config_from_args(args: argparse.Namespace) -> SmoothQuantConfig:
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(SmoothQuantConfig)}
    values["exclude"] = tuple(values["exclude"] or ())
    for name in ("dynamic_sites", "outlier_sites"):
        sites = values.pop(name)
        if sites is not None:  # not given: the dataclass default
            values[name] = () if "none" in sites else tuple(sites)
    return SmoothQuantConfig(**values)


def load_any(name: str) -> Any:
    """A built-in config (random weights) or a local checkpoint."""
    from ..bench.configs import is_builtin, random_model
    from ..checkpoint.models import load_model

    return random_model(name) if is_builtin(name) else load_model(name, task="base")


def checked_threads(threads: int | None) -> int | None:
    """--threads: at most this process's CPUs (more only adds threads that wait)."""
    from ..errors import SquantError

    available = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if threads is not None and available and threads > available:
        raise SquantError(f"--threads {threads} exceeds the {available} CPUs this process may use")
    return threads


def add_runtime_argument(parser: argparse.ArgumentParser, default: str, why: str) -> None:
    from ..engine.runtime import RUNTIMES

    parser.add_argument(
        "--runtime",
        choices=RUNTIMES,
        default=default,
        help=f"what runs the batches (default {default}: {why}): package = an AOTInductor "
        "package of the quantized directory, exported on first use (dynamic shapes) and "
        "cached under squant's cache, checked against eager at each load; compiled = "
        "squant.compile at every start-up (dynamic shapes, C++ wrapper, checked against "
        "eager; ~1-2 min); auto = package for a quantized directory (compiled if no package "
        "can be built or --attention is named), compiled for a model quantized at start-up, "
        "eager for a float checkpoint",
    )
    from ..runtime.compiler import ATTENTIONS

    parser.add_argument(
        "--attention",
        choices=ATTENTIONS,
        default="auto",
        help="the compiled runtime's attention kernel (default auto: the faster of squant's "
        "and sdpa, timed at start-up; name one so that every replica or actor computes the "
        "same vectors, as timing may pick differently in each)",
    )


def add_dataclass_arguments(
    parser: argparse.ArgumentParser,
    cls: type,
    types: Mapping[str, Callable[[str], Any]],
    only: Sequence[str] | None = None,
    defaults: Mapping[str, Any] | None = None,
) -> None:
    """One flag per field of a config dataclass (or of the fields named in `only`):
    `--field-name` (or metadata["flag"]), its default the field's, its help the field's
    metadata["help"], booleans as switches, Literal types as choices. types: the argparse type
    of non-str fields (positive_int, ...); defaults: a command's own, where it differs."""
    hints = typing.get_type_hints(cls)
    for field in _fields(cls, only):
        default = (defaults or {}).get(field.name, field.default)
        flag = field.metadata.get("flag", "--" + field.name.replace("_", "-"))
        common: dict[str, Any] = {"dest": field.name, "help": field.metadata.get("help")}
        hint = hints[field.name]
        if hint is bool:
            action = "store_false" if default else "store_true"
            parser.add_argument(flag, action=action, **common)
        elif typing.get_origin(hint) is typing.Literal:
            choices = typing.get_args(hint)
            parser.add_argument(flag, choices=choices, default=default, **common)
        else:
            kind = types.get(field.name, str)
            metavar = flag.removeprefix("--").replace("-", "_").upper()  # the flag's, not dest's
            parser.add_argument(flag, type=kind, default=default, metavar=metavar, **common)


def dataclass_values(
    cls: type, args: argparse.Namespace, only: Sequence[str] | None = None
) -> dict[str, Any]:
    """The values of the flags add_dataclass_arguments added, by field name."""
    return {f.name: getattr(args, f.name) for f in _fields(cls, only)}


def dataclass_from_args(cls: type, args: argparse.Namespace) -> Any:
    """The config dataclass from the flags add_dataclass_arguments added (for all fields)."""
    return cls(**dataclass_values(cls, args))


def _fields(cls: type, only: Sequence[str] | None) -> list[dataclasses.Field[Any]]:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    return list(fields.values()) if only is None else [fields[name] for name in only]


# the argparse types of ServeConfig's fields that are flags (squant serve, squant embed)
ENGINE_FLAG_TYPES: dict[str, Callable[[str], Any]] = {
    "instances": positive_int,
    "cores_per_instance": positive_int,
    "max_batch_requests": positive_int,
    "max_batch_tokens": positive_int,
    "max_queue": positive_int,
    "timeout_s": positive_float,
    "max_concurrent": positive_int,
    "malloc_arenas": int,
    "max_queue_ms": float,
    "max_wait_ms": float,
}
