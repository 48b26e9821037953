"""`squant embed`: a corpus of texts to embeddings on disk, resumable, on the serving engine.

    report = embed_file(engine, "corpus.jsonl", "embeddings/", shard_rows=10_000)

Input: one text per line (.txt; an empty line is an empty text) or JSONL with a text field
(as for calibration files); row i is the i-th line (.txt) or the i-th non-blank line (.jsonl).
Output: a directory of Parquet shards, `part-00000.parquet`, ... each holding rows
[k * shard_rows, (k + 1) * shard_rows) as columns `row` (int64) and `embedding`
(float32 x dim), plus `embed.json` (model, input size, shard size, pooling, normalization,
truncation length).

Never loses or duplicates a row: a shard is written to a temporary file and renamed into
place only when complete, so after a crash every shard file present is whole; a rerun with
the same arguments skips the shards already there and embeds the rest. A rerun with another
input, model or shard size is refused instead of mixing results.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from ..data import text_from_record
from ..engine.config import ServeConfig
from ..engine.engine import Engine
from ..errors import SquantError
from ..files import iter_jsonl, model_sha256

MANIFEST = "embed.json"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class EmbedReport:
    rows: int
    dim: int
    shards: int
    skipped_shards: int  # already complete from an earlier run
    seconds: float
    out: Path
    embedded_rows: int = -1  # rows embedded by this run (-1: all rows)

    def line(self) -> str:
        done = self.rows if self.embedded_rows < 0 else self.embedded_rows
        # the rate of this run's work: rows found complete from an earlier run cost nothing
        rate = f"; {done / self.seconds:.1f} rows/s" if self.seconds and done else ""
        return (
            f"{self.rows} rows x {self.dim} -> {self.out} ({self.shards} shards, "
            f"{self.skipped_shards} already there){rate}"
        )


def read_rows(path: Path) -> Iterator[str]:
    """The texts of `path`, one per row, streamed (a corpus need not fit in memory)."""
    if not path.is_file():
        raise SquantError(f"input {path} does not exist")
    try:
        if path.suffix == ".jsonl":
            for n, record in iter_jsonl(path, objects_only=False):
                text = text_from_record(record, f"{path}:{n}")
                if not isinstance(text, str):
                    raise SquantError(f"{path}:{n}: a pair; squant embed takes single texts")
                yield text
        else:
            with path.open(encoding="utf-8") as f:
                for line in f:
                    yield line.rstrip("\n")
    except UnicodeDecodeError as e:
        raise SquantError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start})") from None


def _chunks(rows: Iterator[str], size: int) -> Iterator[list[str]]:
    chunk: list[str] = []
    for text in rows:
        chunk.append(text)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _identity(input_path: Path, shard_rows: int, model_name: str) -> dict[str, Any]:
    """The manifest fields known before the model is loaded."""
    return {
        "format_version": FORMAT_VERSION,
        "input": str(input_path.resolve()),
        "input_bytes": input_path.stat().st_size,
        "model": model_name,
        # the model's content, not just its path: a directory re-quantized in place
        # must not resume into shards the old weights wrote
        "model_sha256": model_sha256(model_name) if model_name else None,
        "shard_rows": shard_rows,
    }


def check_before_loading(
    input_path: str | Path, out: str | Path, shard_rows: int, model_name: str = ""
) -> None:
    """Everything `squant embed` can refuse without the model, checked before minutes of
    loading and compiling: the input (present, non-empty, its first row a single text), the
    output (a directory that is not the input or the model, or inside them), and a resume
    (the manifest's input, model content and shard size match). Changes nothing."""
    if shard_rows < 1:
        raise SquantError(f"shard size must be >= 1, got {shard_rows}")
    input_path, out = Path(input_path), Path(out)
    if not input_path.is_file():
        raise SquantError(f"input {input_path} does not exist")
    if input_path.stat().st_size == 0:
        raise SquantError(f"input {input_path} is empty: nothing to embed")
    if out.exists() and not out.is_dir():
        raise SquantError(f"--out {out} is a file; give a directory for the shards")
    where = out.resolve()
    sources = [("the input", input_path)]
    if model_name and Path(model_name).exists():  # a local directory (not a hub name)
        sources.append(("the model", Path(model_name)))
    for name, given in sources:
        source = given.resolve()
        if where == source or source in where.parents or where in source.parents:
            raise SquantError(f"--out {out} overlaps {name} {given}; give another directory")
    next(read_rows(input_path), None)  # its first row: a wrong format fails now, not later
    _check_manifest(out, _identity(input_path, shard_rows, model_name), create=False)


def _check_manifest(out: Path, wanted: dict[str, Any], create: bool = True) -> None:
    """Refuse `out` unless it is new, empty, or holds a manifest matching `wanted` (only the
    fields it names); with create, write the full manifest."""
    if out.exists() and not out.is_dir():
        raise SquantError(f"--out {out} is a file; give a directory for the shards")
    path = out / MANIFEST
    if path.is_file():
        try:
            have = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise SquantError(f"{path} is unreadable ({e}); use a new --out") from None
        differs = sorted(k for k in wanted if k not in have or have[k] != wanted[k])
        if differs:
            unknown = [k for k in differs if k not in have]
            why = ""
            if unknown:
                why = f" (it does not record {', '.join(unknown)}: written by an older squant"
                if "truncation" in unknown:
                    why += ", which truncated long texts at the model's positions"
                why += ")"
            raise SquantError(
                f"{out} holds embeddings made with other {', '.join(differs)}{why}; "
                "use a new --out (nothing was changed)"
            )
    elif out.exists() and any(out.iterdir()):
        raise SquantError(f"{out} is not empty and holds no {MANIFEST}; use a new --out")
    if not create:
        return
    out.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(wanted, indent=2))
    os.replace(tmp, path)


def _shard_complete(path: Path, rows: int) -> bool:
    import pyarrow.parquet as pq

    try:
        return bool(pq.ParquetFile(path).metadata.num_rows == rows)
    except Exception:  # a damaged file is redone, never trusted
        return False


def _write_shard(path: Path, first_row: int, vectors: torch.Tensor) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    n, dim = vectors.shape
    flat = pa.array(vectors.float().numpy().reshape(-1))
    table = pa.table(
        {
            "row": pa.array(range(first_row, first_row + n), type=pa.int64()),
            "embedding": pa.FixedSizeListArray.from_arrays(flat, dim),
        }
    )
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)  # whole or absent: a crash never leaves half a shard


ShardEmbedder = Callable[[list[list[str]]], list[torch.Tensor]]


def embed_file(
    engine: Engine,
    input_path: str | Path,
    out: str | Path,
    shard_rows: int = 10_000,
    normalize: bool | None = None,
    model_name: str = "",
    progress: bool = True,
) -> EmbedReport:
    """Embed every row of `input_path` into Parquet shards under `out` (see the module
    docstring); the engine must be started. normalize: None = the model's own setting."""
    if engine.task != "embed":
        raise SquantError(f"this model serves /{engine.task}; squant embed needs a base model")
    normalize = engine.normalize_default if normalize is None else normalize

    def embed_shards(shards: list[list[str]]) -> list[torch.Tensor]:
        return [embed_texts(engine, texts, normalize) for texts in shards]

    return write_shards(
        input_path,
        out,
        shard_rows,
        embed_shards,
        1,
        engine.pooling,
        normalize,
        model_name,
        progress,
        engine.stated_length,
    )


def write_shards(
    input_path: str | Path,
    out: str | Path,
    shard_rows: int,
    embed_shards: ShardEmbedder,
    shards_per_call: int,
    pooling: str,
    normalize: bool,
    model_name: str = "",
    progress: bool = True,
    truncation: int | None = None,
) -> EmbedReport:
    """The resumable shard loop behind every `squant embed`: read the rows, skip the shards
    already complete, hand up to `shards_per_call` missing ones at a time to `embed_shards`
    (texts -> final vectors, one [rows, dim] tensor per shard, in order), write each shard
    atomically. truncation: where the model truncates texts as its files state (None: at its
    positions); recorded, so a resumed directory never mixes two truncation lengths."""
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        raise SquantError("squant embed writes Parquet: pip install 'squant[data]'") from None
    input_path, out = Path(input_path), Path(out)
    check_before_loading(input_path, out, shard_rows, model_name)
    _check_manifest(
        out,
        {
            **_identity(input_path, shard_rows, model_name),
            "pooling": pooling,
            "normalize": normalize,
            "truncation": truncation,
        },
    )
    t0 = time.perf_counter()
    rows = shards = skipped = dim = embedded = 0
    pending: list[tuple[int, list[str]]] = []
    bar = tqdm(desc="embedding", unit="row", disable=not progress)

    def flush() -> None:
        nonlocal dim
        vectors = embed_shards([texts for _, texts in pending])
        for (k, texts), v in zip(pending, vectors, strict=True):
            if v.shape[0] != len(texts):
                raise SquantError(f"shard {k}: {v.shape[0]} vectors for {len(texts)} rows")
            _write_shard(out / f"part-{k:05d}.parquet", k * shard_rows, v)
            dim = int(v.shape[1])
            bar.update(len(texts))
        pending.clear()

    with bar:  # closed (its line ended) before an error in the input is printed
        for k, texts in enumerate(_chunks(read_rows(input_path), shard_rows)):
            shards += 1
            rows += len(texts)
            if _shard_complete(out / f"part-{k:05d}.parquet", len(texts)):
                skipped += 1
                bar.update(len(texts))
                continue
            pending.append((k, texts))
            embedded += len(texts)
            if len(pending) == shards_per_call:
                flush()
        if pending:
            flush()
    if dim == 0 and shards:  # every shard was there already: read the width back
        import pyarrow.parquet as pq

        dim = int(pq.read_schema(out / "part-00000.parquet").field("embedding").type.list_size)
    return EmbedReport(rows, dim, shards, skipped, time.perf_counter() - t0, out, embedded)


def offline_config(**settings: Any) -> ServeConfig:
    """The engine settings of bulk embedding (local or on Ray): nothing waits for an answer,
    so nothing expires and no queued-time limit refuses work."""
    return ServeConfig(max_queue=4096, timeout_s=1e9, max_queue_ms=0, **settings)


def embed_texts(engine: Engine, texts: list[str], normalize: bool) -> torch.Tensor:
    """[len(texts), dim] in order, through the engine's batching (at most its queue bound at
    a time), L2-normalized when asked."""
    out: list[torch.Tensor] = []
    step = engine.config.max_queue
    for i in range(0, len(texts), step):
        futures = engine.submit(engine.tokenize(texts[i : i + step], truncate=True))
        out += [f.result() for f in futures]
    vectors = torch.stack(out)
    return torch.nn.functional.normalize(vectors, dim=-1) if normalize else vectors
