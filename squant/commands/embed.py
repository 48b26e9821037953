"""`squant embed`: a corpus to embeddings on disk (Parquet shards), resumable."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ..engine.config import OFFLINE_BATCH_TOKENS, ServeConfig
from .common import (
    ENGINE_FLAG_TYPES,
    add_dataclass_arguments,
    add_runtime_argument,
    dataclass_values,
    positive_int,
)

if TYPE_CHECKING:
    from ..embed.local import EmbedReport

# the engine settings `squant embed` takes as flags (ServeConfig's fields, help and types)
EMBED_FLAGS = ("instances", "cores_per_instance", "max_batch_requests", "max_batch_tokens")

HELP = "embed a corpus (one text per line / JSONL) into Parquet shards, resumable"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="directory from squant quantize / export, or a float checkpoint")
    p.add_argument("input", help="texts: .txt (one per line) or .jsonl (a text field per line)")
    p.add_argument("--out", required=True, help="directory of part-NNNNN.parquet shards")
    p.add_argument("--shard-rows", type=positive_int, default=10_000)
    add_dataclass_arguments(
        p,
        ServeConfig,
        ENGINE_FLAG_TYPES,
        EMBED_FLAGS,
        {"max_batch_tokens": OFFLINE_BATCH_TOKENS},  # nothing waits: bigger batches
    )
    norm = p.add_mutually_exclusive_group()
    norm.add_argument("--normalize", dest="normalize", action="store_true", default=None)
    norm.add_argument("--no-normalize", dest="normalize", action="store_false")
    p.add_argument("--pooling-from", default=None, help="as for squant serve")
    add_runtime_argument(p, "auto", "a quantized directory runs its cached package")
    ray = p.add_argument_group("Ray Data (extra squant[ray])")
    ray.add_argument("--ray", action="store_true", help="embed on Ray actors (local or a cluster)")
    ray.add_argument("--ray-address", default=None, help="an existing cluster (default: local)")
    ray.add_argument("--actors", type=positive_int, default=None, help="default: cores / C")
    ray.add_argument("--cores-per-actor", type=positive_int, default=1)


def run(args: argparse.Namespace) -> None:
    from ..embed.local import check_before_loading, embed_file, offline_config
    from ..engine.loading import engine_for

    # before minutes of loading and compiling
    check_before_loading(args.input, args.out, args.shard_rows, str(args.model))
    if args.ray:
        print(_run_on_ray(args).line())
        return
    config = offline_config(
        **dataclass_values(ServeConfig, args, EMBED_FLAGS),
        runtime=args.runtime,
        attention=args.attention,
    )
    engine = engine_for(args.model, config, args.pooling_from)
    engine.start(warm=False)
    try:
        report = embed_file(
            engine, args.input, args.out, args.shard_rows, args.normalize, str(args.model)
        )
    finally:
        engine.stop(1.0)
    print(report.line())


def _run_on_ray(args: argparse.Namespace) -> EmbedReport:
    from ..errors import SquantError

    try:
        import ray
    except ImportError:
        raise SquantError("--ray needs the ray extra: pip install 'squant[ray]'") from None
    from ..embed.ray_data import embed_file_on_ray

    started = not ray.is_initialized()  # inside a Ray driver already: use its connection
    if started:
        from ..serve.ray_app import connect

        connect(args.ray_address, include_dashboard=False, log_to_driver=False)
    try:
        actors = args.actors or max(
            1, int(ray.cluster_resources().get("CPU", 1)) // args.cores_per_actor
        )
        return embed_file_on_ray(
            args.model,
            args.input,
            args.out,
            args.shard_rows,
            actors,
            args.cores_per_actor,
            args.normalize,
            args.pooling_from,
            model_name=str(args.model),
            attention=args.attention,
        )
    finally:
        if started:
            ray.shutdown()
