"""`squant serve`: an HTTP server for a quantized (or float) encoder."""

from __future__ import annotations

import argparse
import os
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from ..engine.config import ServeConfig
from ..errors import SquantError
from ..serve.listen import ListenConfig
from ..serve.ray_app import RayConfig
from .common import (
    ENGINE_FLAG_TYPES,
    add_dataclass_arguments,
    add_runtime_argument,
    dataclass_from_args,
    dataclass_values,
    port_number,
    positive_float,
    positive_int,
)

if TYPE_CHECKING:
    from ..engine.engine import Engine
    from ..serve.app import HttpConfig

API_KEY_ENV = "SQUANT_API_KEY"

# ServeConfig's fields that are `squant serve` flags, with their defaults and help (the rest:
# --runtime/--attention shared with embed, --model-process's auto, and settings not exposed)
SERVE_FLAGS = (
    "instances",
    "cores_per_instance",
    "max_batch_requests",
    "max_batch_tokens",
    "max_queue",
    "timeout_s",
    "max_concurrent",
    "malloc_arenas",
    "max_queue_ms",
    "max_wait_ms",
    "watch_ranges",
)
DEFAULTS = ServeConfig()
LISTEN_FLAG_TYPES = {"port": port_number, "header_timeout_s": positive_float}
# RayConfig's fields are all counts: --replicas, --cores-per-replica, --max-queued-requests
RAY_FLAG_TYPES = {name: positive_int for name in RayConfig.__dataclass_fields__}

HELP = "serve a model over HTTP (TEI/OpenAI-compatible routes, dynamic batching)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "model",
        help="a deploy directory from `squant export` (the compiled package), a directory "
        "written by `squant quantize`/squant.save, or a float checkpoint (served in FP32)",
    )
    add_dataclass_arguments(p, ListenConfig, LISTEN_FLAG_TYPES, ("host", "port"))
    add_dataclass_arguments(p, ServeConfig, ENGINE_FLAG_TYPES, SERVE_FLAGS)
    add_runtime_argument(
        p,
        DEFAULTS.runtime,
        "a quantized directory runs its package, built once (~1 min) and cached",
    )
    p.add_argument(
        "--model-process",
        choices=("auto", "on", "off"),
        default="auto",
        help="run the model in a child process of its own, so HTTP, JSON and tokenization never "
        "share its GIL (~+300 MB for the second process). auto: on when the instances leave "
        "a core to the front end (served/bench 0.94x against 0.84x in one process), for "
        "directories from squant quantize/save and float checkpoints without --calib",
    )
    p.add_argument(
        "--served-model-name",
        default=None,
        help="the model's name in /info and /v1/models (default: MODEL's directory name)",
    )
    p.add_argument(
        "--api-key",
        default=os.environ.get(API_KEY_ENV),
        help=f"require `Authorization: Bearer KEY` on every route but /health and /ready "
        f"(default: ${API_KEY_ENV}; prefer the variable: a flag shows in the process list)",
    )
    p.add_argument(
        "--cors-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="a browser origin allowed to call the API, e.g. https://app.example.com "
        "(repeatable; '*' = any; default none)",
    )
    add_dataclass_arguments(p, ListenConfig, LISTEN_FLAG_TYPES, ("header_timeout_s", "access_log"))
    p.add_argument(
        "--ray",
        action="store_true",
        help="serve as a Ray Serve application (extra squant[ray]): --replicas servers, each "
        "pinned to its own cores of its node",
    )
    add_dataclass_arguments(p, RayConfig, RAY_FLAG_TYPES)
    p.add_argument("--ray-address", default=None, help="an existing cluster (default: local)")
    p.add_argument(
        "--calib",
        default=None,
        help="MODEL is a float checkpoint: quantize it at start-up (static INT8) on these texts "
        "(.txt / .jsonl / .tsv); without it a float checkpoint is served in FP32",
    )
    p.add_argument(
        "--pooling-from",
        default=None,
        help="a sentence-transformers directory whose pooling/normalize config to use "
        "(default: MODEL's own, else mean pooling)",
    )


def build_engine(args: argparse.Namespace) -> Engine:
    from ..engine.loading import engine_for

    return engine_for(args.model, serve_config(args), args.pooling_from, args.calib)


def serve_config(args: argparse.Namespace) -> ServeConfig:
    config = ServeConfig(
        **dataclass_values(ServeConfig, args, SERVE_FLAGS),
        runtime=args.runtime,
        attention=args.attention,
    )
    if args.model_process == "auto":
        from ..engine.loading import model_process_pays

        on = model_process_pays(args.model, config, args.calib, args.ray)
    else:
        on = args.model_process == "on"
    return replace(config, model_process=on)


def http_config(args: argparse.Namespace) -> HttpConfig:
    from ..serve.app import HttpConfig

    return HttpConfig(
        model_name=args.served_model_name or Path(args.model).resolve().name,
        api_key=args.api_key or None,
        cors_origins=tuple(args.cors_origin),
    )


def _check_port_free(host: str, port: int) -> None:
    import socket

    try:
        with socket.create_server((host, port)):
            pass
    except OSError as e:
        raise SquantError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    except (TypeError, UnicodeError, ValueError):  # a host name that cannot be encoded
        raise SquantError(f"--host {host!r} is not a host name or address") from None


def run(args: argparse.Namespace) -> None:
    try:
        import uvicorn  # noqa: F401  (the serve extra: checked before anything loads)

        from ..serve.server import serve_http
    except ImportError as e:
        raise SquantError(
            f"squant serve needs the serve extra: pip install 'squant[serve]' ({e})"
        ) from None
    http = http_config(args)  # its errors before anything loads
    listen = dataclass_from_args(ListenConfig, args)
    _check_port_free(listen.host, listen.port)  # before minutes of loading and warm-up
    if args.ray:
        _run_ray(args, http, listen)
        return
    engine = build_engine(args)
    if engine.quantize_report is not None:
        print("\n".join(engine.quantize_report.lines()))
    say = lambda line: print(line, flush=True)  # noqa: E731
    serve_http(engine, http, listen, say)


def _run_ray(args: argparse.Namespace, http: HttpConfig, listen: ListenConfig) -> None:
    from ..serve.ray_app import application
    from ..serve.ray_app import run as run_on_ray

    if not Path(args.model).is_dir():
        raise SquantError(f"{args.model} is not a directory")
    layout = dataclass_from_args(RayConfig, args)
    app = application(args.model, serve_config(args), layout, args.pooling_from, args.calib, http)
    run_on_ray(app, layout, listen, args.ray_address)
