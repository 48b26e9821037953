"""`squant serve`: an HTTP server for a quantized (or float) encoder."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import SquantError
from .common import positive_float, positive_int

HELP = "serve a model over HTTP (TEI/OpenAI-compatible routes, dynamic batching)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "model",
        help="a directory written by `squant quantize`/squant.save, or a float checkpoint "
        "(served in FP32)",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=positive_int, default=8080)
    p.add_argument("--instances", type=positive_int, default=None, help="default: cores / C")
    p.add_argument("--cores-per-instance", type=positive_int, default=None)
    p.add_argument("--max-batch-requests", type=positive_int, default=32)
    p.add_argument("--max-batch-tokens", type=positive_int, default=8192)
    p.add_argument("--max-queue", type=positive_int, default=1024, help="sequences waiting")
    p.add_argument("--timeout", type=positive_float, default=30.0, help="seconds in the queue")
    p.add_argument(
        "--pooling-from",
        default=None,
        help="a sentence-transformers directory whose pooling/normalize config to use "
        "(default: MODEL's own, else mean pooling)",
    )


def build_engine(args: argparse.Namespace):
    from ..models import load_model, load_tokenizer
    from ..serialization import CONFIG_FILE, load
    from ..serve.engine import Engine, ServeConfig, pooling_of

    path = Path(args.model)
    if args.pooling_from is not None and not Path(args.pooling_from).is_dir():
        raise SquantError(f"--pooling-from {args.pooling_from} is not a directory")
    if (path / "manifest.json").is_file() and not (path / CONFIG_FILE).is_file():
        raise SquantError(
            f"{path} is an exported .pt2 package (fixed shapes); serve the directory written "
            "by `squant quantize` instead"
        )
    model = load(path) if (path / CONFIG_FILE).is_file() else load_model(path)
    tokenizer = load_tokenizer(path)
    config = ServeConfig(
        instances=args.instances,
        cores_per_instance=args.cores_per_instance,
        max_batch_requests=args.max_batch_requests,
        max_batch_tokens=args.max_batch_tokens,
        max_queue=args.max_queue,
        timeout_s=args.timeout,
    )
    pooling, normalize = pooling_of(args.pooling_from or path)
    # Workers run the eager model: a squant.compile runner with dynamic shapes (Engine's
    # `runner`) recompiled under threaded load here (dynamo guards on each thread's
    # num_threads, and one "unexpected recompilation" under concurrency): 27.7 req/s, p99
    # 2.7 s against 81.9 req/s, p99 177 ms eager (real MiniLM, 2x1 workers, 8 clients).
    return Engine(model, tokenizer, config, pooling, normalize)


def _check_port_free(host: str, port: int) -> None:
    import socket

    try:
        with socket.create_server((host, port)):
            pass
    except OSError as e:
        raise SquantError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None


def run(args: argparse.Namespace) -> None:
    try:
        import uvicorn

        from ..serve.app import create_app
    except ImportError as e:
        raise SquantError(
            f"squant serve needs the serve extra: pip install 'squant[serve]' ({e})"
        ) from None
    _check_port_free(args.host, args.port)  # before minutes of loading and warm-up
    engine = build_engine(args)
    print(
        f"warming {len(engine.buckets)} shapes (buckets {list(engine.buckets)}) on "
        f"{engine.placement.instances} instance(s) x {engine.placement.cores_per_instance} core(s)"
    )
    engine.start()
    uvicorn.run(create_app(engine, Path(args.model).name), host=args.host, port=args.port)
