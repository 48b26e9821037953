"""`squant serve`: an HTTP server for a quantized (or float) encoder."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import SquantError
from .common import positive_float, positive_int

if TYPE_CHECKING:
    from torch import nn

    from ..serve.engine import Engine

HELP = "serve a model over HTTP (TEI/OpenAI-compatible routes, dynamic batching)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "model",
        help="a deploy directory from `squant export` (the compiled package), a directory "
        "written by `squant quantize`/squant.save, or a float checkpoint (served in FP32)",
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
        "--max-concurrent",
        type=positive_int,
        default=512,
        help="requests in flight (tokenizing, queued, running); beyond it 429 at once",
    )
    p.add_argument(
        "--malloc-arenas",
        type=int,
        default=1,
        help="glibc malloc arenas (0: glibc's default); one keeps N workers near one's memory",
    )
    p.add_argument(
        "--max-queue-ms",
        type=float,
        default=2000.0,
        help="refuse (429) while the queued work would take longer than this to run (0: off)",
    )
    p.add_argument(
        "--pooling-from",
        default=None,
        help="a sentence-transformers directory whose pooling/normalize config to use "
        "(default: MODEL's own, else mean pooling)",
    )


def build_engine(args: argparse.Namespace) -> Engine:
    from ..bench.runner import plan
    from ..export import MANIFEST, load_packaged
    from ..models import load_model, load_tokenizer
    from ..sentence_transformer import inner_model, is_sentence_transformer
    from ..serialization import CONFIG_FILE, load
    from ..serve.engine import Engine, ServeConfig, pooling_of
    from ..shapes import PaddedShapes

    path = Path(args.model)
    if args.pooling_from is not None and not Path(args.pooling_from).is_dir():
        raise SquantError(f"--pooling-from {args.pooling_from} is not a directory")
    tokenizer = load_tokenizer(path)
    max_batch = args.max_batch_requests
    if (path / MANIFEST).is_file():
        # a deploy directory: the AOTInductor package (no Python between kernels) at its
        # exported batch (smaller batches are padded). Its Python binding holds the GIL for a
        # whole call, so instances take turns: give one instance all the cores.
        placement = plan(args.instances, args.cores_per_instance)
        package = load_packaged(path, num_runners=placement.instances)
        m = package.exported.manifest
        buckets = None if m["dynamic_seq"] else (m["seq"],)
        pad = int(getattr(tokenizer, "pad_token_id", 0) or 0)
        model: nn.Module = PaddedShapes(package, m["batch"], buckets, pad, min_seq=2)
        max_batch = min(max_batch, m["batch"])  # a bigger batch would run as serial chunks
    else:
        model = load(path) if (path / CONFIG_FILE).is_file() else load_model(path)
        if is_sentence_transformer(model):  # pooling comes from its modules (pooling_of)
            model = inner_model(model)
    config = ServeConfig(
        instances=args.instances,
        cores_per_instance=args.cores_per_instance,
        max_batch_requests=max_batch,
        max_batch_tokens=args.max_batch_tokens,
        max_queue=args.max_queue,
        timeout_s=args.timeout,
        max_queue_ms=args.max_queue_ms,
        max_concurrent=args.max_concurrent,
        malloc_arenas=args.malloc_arenas,
    )
    pooling, normalize = pooling_of(args.pooling_from or path)
    # Directories from `squant quantize` run eagerly: a squant.compile runner with dynamic
    # shapes recompiled under threaded load here (dynamo guards on each thread's num_threads,
    # and one "unexpected recompilation" under concurrency): 27.7 req/s, p99 2.7 s against
    # 81.9 req/s, p99 177 ms eager (real MiniLM, 2x1 workers, 8 clients). For compiled speed,
    # serve a deploy directory (`squant export --dynamic-seq --batch N`).
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
