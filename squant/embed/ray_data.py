"""Offline bulk inference on Ray Data (optional extra `squant[ray]`): a corpus embedded across
the cores of one machine or a cluster, each Ray actor holding one squant model pinned to its
own cores.

As a building block in a user's own pipeline:

    ds = ray.data.read_parquet("s3://corpus/")
    ds = ds.map_batches(
        SquantEmbedder,
        fn_constructor_kwargs={"model": "/models/minilm-int8", "text_column": "text"},
        batch_size=256, concurrency=8, num_cpus=2,  # 8 actors x 2 cores
    )

and behind `squant embed MODEL INPUT --out DIR --ray`, which keeps the local command's
guarantees (Parquet shards written whole or not at all, resumable, every row exactly once, in
order): the driver reads the input and hands the missing shards to the actor pool a few at a
time (`embed_file_on_ray`).

Pinning: Ray schedules actors by CPU count but does not pin them. Each SquantEmbedder claims
the lowest free slot of C cores on its node through a lock file (held for the actor's life,
released by the OS when it dies), then confines itself to those cores, as `squant serve`'s
instances do. The model directory must be readable on every node.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..engine.config import OFFLINE_BATCH_TOKENS
from ..errors import SquantError
from ..runtime.compiler import Attention
from ..runtime.placement import core_slots, pin_current_thread
from .local import EmbedReport, embed_texts, offline_config, write_shards

ROUND_ROWS = 50_000  # rows per Ray dataset of `squant embed --ray` (see embed_file_on_ray)


def claim_cores(cores: int, lock_dir: str | Path | None = None) -> tuple[list[int], Any]:
    """The lowest free slot of `cores` cores of this machine's allowed CPUs, and the open lock
    file that holds it (keep it open: closing it, or the process ending, frees the slot).
    ([], None) when every slot is taken (more actors than cores: they then share)."""
    directory = Path(lock_dir or Path(tempfile.gettempdir()) / f"squant-cores-{os.getuid()}")
    directory.mkdir(parents=True, exist_ok=True)
    for slot, slot_cores in enumerate(core_slots(cores)):
        handle = (directory / f"slot-{cores}x{slot}.lock").open("w")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        return list(slot_cores), handle
    return [], None


class SquantEmbedder:
    """A Ray Data callable (`Dataset.map_batches`): adds an `embedding` column (float32 [dim]
    per row) computed from `text_column` by a squant model. model: any directory `squant
    serve` takes (from `squant quantize` / `squant export`, or a float checkpoint). cores:
    the cores this actor pins itself to (default: the CPUs Ray gave it, else all)."""

    def __init__(
        self,
        model: str | Path,
        text_column: str = "text",
        cores: int | None = None,
        normalize: bool | None = None,
        pooling_from: str | Path | None = None,
        max_batch_tokens: int = OFFLINE_BATCH_TOKENS,
        attention: Attention = "auto",
    ) -> None:
        from ..engine.loading import engine_for

        cores = cores or _ray_cpus() or len(os.sched_getaffinity(0))
        pinned, self._lock = claim_cores(cores)
        if pinned:
            pin_current_thread(pinned)
        else:
            warnings.warn(
                f"no free slot of {cores} cores on this node: this actor is not pinned",
                stacklevel=2,
            )
        self.cores = pinned
        self.text_column = text_column
        config = offline_config(
            instances=1,
            cores_per_instance=len(pinned) or cores,
            max_batch_tokens=max_batch_tokens,
            attention=attention,
        )
        self.engine = engine_for(model, config, pooling_from)
        if self.engine.task != "embed":
            raise SquantError(
                f"{model} serves /{self.engine.task}; SquantEmbedder needs a base model"
            )
        self.normalize = self.engine.normalize_default if normalize is None else normalize
        self.engine.start(warm=False)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.text_column not in batch:
            raise SquantError(
                f"batch has no column {self.text_column!r} (columns: {sorted(batch)})"
            )
        texts = [str(t) for t in batch[self.text_column]]
        vectors = embed_texts(self.engine, texts, self.normalize)
        return {**batch, "embedding": vectors.float().numpy()}

    def __del__(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.stop(1.0)


def _ray_cpus() -> int:
    """CPUs Ray assigned to the current actor (0 outside Ray)."""
    try:
        import ray

        if not ray.is_initialized():
            return 0
        return int(ray.get_runtime_context().get_assigned_resources().get("CPU", 0))
    except Exception:
        return 0


def embed_file_on_ray(
    model: str | Path,
    input_path: str | Path,
    out: str | Path,
    shard_rows: int = 10_000,
    actors: int = 1,
    cores_per_actor: int = 1,
    normalize: bool | None = None,
    pooling_from: str | Path | None = None,
    batch_size: int = 256,
    model_name: str = "",
    progress: bool = True,
    attention: Attention = "auto",
) -> EmbedReport:
    """`squant embed --ray`: the local command's shard loop (embed.write_shards) with each
    group of missing shards embedded by `actors` SquantEmbedder actors on the connected Ray
    cluster (ray.init must have been called). model_name: recorded in the manifest, as the
    local command records it (a rerun, local or on Ray, resumes the same directory)."""
    try:
        import ray
    except ImportError:
        raise SquantError("--ray needs the ray extra: pip install 'squant[ray]'") from None
    from ..checkpoint.sentence_transformer import sentence_settings
    from ..engine.loading import truncation_stated

    model = str(Path(model).resolve())
    st = sentence_settings(Path(pooling_from or model))
    pooling = st.pooling
    normalize = st.normalize if normalize is None else normalize
    ray.data.DataContext.get_current().execution_options.preserve_order = True

    def embed_shards(shards: list[list[str]]) -> list[torch.Tensor]:
        items = [{"row": i, "text": t} for i, t in enumerate(t for s in shards for t in s)]
        ds = ray.data.from_items(items).map_batches(
            SquantEmbedder,
            fn_constructor_kwargs={
                "model": model,
                "cores": cores_per_actor,
                "normalize": normalize,
                "pooling_from": pooling_from,
                "attention": attention,
            },
            batch_size=batch_size,
            batch_format="numpy",
            concurrency=actors,
            num_cpus=cores_per_actor,
        )
        rows, vectors = [], []
        for batch in ds.iter_batches(batch_size=None, batch_format="numpy"):
            rows.append(batch["row"])
            vectors.append(batch["embedding"])
        order = np.concatenate(rows)
        if sorted(order.tolist()) != list(range(len(items))):  # never lose or duplicate
            raise SquantError(f"Ray returned {len(order)} rows for {len(items)} sent")
        stacked = torch.from_numpy(np.concatenate(vectors)[np.argsort(order)])
        return list(torch.split(stacked, [len(s) for s in shards]))

    # Each round is one Ray dataset, and its actors start anew (one model load each): rounds
    # of ~ROUND_ROWS rows (at least two shards per actor) amortize that while holding only
    # one round's texts and vectors in the driver.
    per_round = max(2 * actors, -(-ROUND_ROWS // shard_rows), 1)
    return write_shards(
        input_path,
        out,
        shard_rows,
        embed_shards,
        per_round,
        pooling,
        normalize,
        model_name,
        progress,
        truncation_stated(model, pooling_from),
    )
