"""`squant embed` on this machine vs `squant embed --ray` on a local Ray instance, same
model, corpus and cores: rows per second end to end (model loading and, for Ray, start-up of
the cluster and its actors included, as a user sees it).

    python benchmarks/embed_ray.py MODEL_DIR CORPUS.txt [--rounds 2] [--cores 2]

Runs alternate (local, Ray, local, Ray, ...) so drift hits both; each writes a new directory.
Local: `--instances N --cores-per-instance 1`; Ray: N actors x 1 core (N = --cores).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("corpus", type=Path)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--cores", type=int, default=2)
    p.add_argument("--shard-rows", type=int, default=1000)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    rows = sum(1 for _ in args.corpus.open(encoding="utf-8"))
    base = [sys.executable, "-m", "squant.cli", "embed", args.model, str(args.corpus)]
    common = ["--shard-rows", str(args.shard_rows)]
    seconds: dict[str, list[float]] = {"local": [], "ray": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for kind in ("local", "ray"):
                out = ["--out", str(Path(tmp) / f"{kind}-{r}")]
                extra = (
                    ["--instances", str(args.cores), "--cores-per-instance", "1"]
                    if kind == "local"
                    else ["--ray", "--actors", str(args.cores), "--cores-per-actor", "1"]
                )
                seconds[kind].append(run([*base, *out, *common, *extra]))
                print(f"round {r} {kind}: {rows / seconds[kind][-1]:.1f} rows/s", flush=True)
    med = {k: statistics.median(v) for k, v in seconds.items()}
    print(
        f"{rows} rows, {args.cores} cores: local {rows / med['local']:.1f} rows/s, "
        f"Ray {rows / med['ray']:.1f} rows/s ({med['local'] / med['ray']:.2f}x)"
    )
    if args.json:
        record = {
            "rows": rows,
            "cores": args.cores,
            "seconds": seconds,
            "shard_rows": args.shard_rows,
        }
        args.json.write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
