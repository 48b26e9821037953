"""A long run of mixed traffic against a warm server: does anything compile after /ready,
and does the latency tail stay close to the median?

    python benchmarks/soak.py --serve "squant serve int8/ --port 8080" \
        --texts .cache/snli/snli_1.0_test.jsonl --duration 600 --json soak.json

Open loop at --rate requests/s (Poisson arrivals). Each request carries 1..--max-texts texts
(as many as /embed takes in one body) of 1..--max-join SNLI sentences joined, so every
length bucket and batch size the batcher can form comes up, in random order. Every response
is checked (one vector per text, finite values). At the end the server's /metrics give the
calls that would have compiled after warm-up (squant_refused_recompiles_total: they ran
eagerly instead) and the result is printed as a table plus JSON with the commit and the
host's ISA: p50/p90/p99 latency, p99/p50, responses by code, recompiles.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import shlex
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.http1 import Http1Pool, HTTPError
from benchmarks.load import read_pool, wait_ready
from squant.bench.report import format_table
from squant.provenance import provenance


def metric(url: str, name: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
        text = r.read().decode()
    found = re.findall(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, flags=re.M)
    return sum(float(v) for v in found)


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def soak(args: argparse.Namespace, pool: list[str]) -> dict:
    rng = random.Random(args.seed)
    latencies: list[float] = []
    codes: Counter[str] = Counter()
    bad = 0

    async def one(client: Http1Pool, texts: list[str]) -> None:
        nonlocal bad
        t0 = time.perf_counter()
        try:
            r = await client.post_json("/embed", {"inputs": texts})
            codes[str(r.status_code)] += 1
            if r.status_code == 200:
                latencies.append(time.perf_counter() - t0)
                vectors = r.json()
                if len(vectors) != len(texts) or not all(
                    all(v == v and abs(v) < 1e6 for v in row) for row in vectors
                ):
                    bad += 1
        except (TimeoutError, HTTPError, OSError) as e:
            codes[type(e).__name__] += 1

    tasks = []
    async with Http1Pool(args.url, args.max_connections, args.timeout) as client:
        start = time.perf_counter()
        next_at = 0.0
        while next_at < args.duration:
            delay = start + next_at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            n = rng.randint(1, args.max_texts)
            texts = [" ".join(rng.sample(pool, rng.randint(1, args.max_join))) for _ in range(n)]
            tasks.append(asyncio.create_task(one(client, texts)))
            next_at += rng.expovariate(args.rate)
        await asyncio.gather(*tasks)
        took = time.perf_counter() - start
    p50, p99 = quantile(latencies, 0.5), quantile(latencies, 0.99)
    return {
        "requests": len(tasks),
        "seconds": round(took, 1),
        "codes": dict(codes),
        "bad_responses": bad,
        "p50_ms": round(p50 * 1000, 1),
        "p90_ms": round(quantile(latencies, 0.9) * 1000, 1),
        "p99_ms": round(p99 * 1000, 1),
        "p99_over_p50": round(p99 / p50, 2) if latencies else None,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8080")
    p.add_argument("--serve", default=None, help="command that starts the server")
    p.add_argument("--texts", required=True, help=".jsonl (sentence1/2) or one text per line")
    p.add_argument("--duration", type=float, default=600.0, help="seconds of traffic")
    p.add_argument("--rate", type=float, default=10.0, help="offered requests/s")
    p.add_argument("--max-texts", type=int, default=8, help="texts per request, up to")
    p.add_argument("--max-join", type=int, default=6, help="sentences per text, up to")
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--max-connections", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    server = subprocess.Popen(shlex.split(args.serve)) if args.serve else None
    try:
        t0 = time.monotonic()
        wait_ready(args.url, 900.0)
        ready_s = time.monotonic() - t0
        refused_before = metric(args.url, "squant_refused_recompiles_total")
        result = asyncio.run(soak(args, read_pool(args.texts, 2000, args.seed)))
        result["ready_s"] = round(ready_s, 1) if server else None
        result["recompiles_after_ready"] = (
            metric(args.url, "squant_refused_recompiles_total") - refused_before
        )
    finally:
        if server is not None:
            server.terminate()
            server.wait(60)
    result.update(
        command=" ".join(sys.argv), server=args.serve, rate=args.rate, provenance=provenance()
    )
    rows = [[k, str(v)] for k, v in result.items() if k not in ("provenance", "command")]
    print(format_table(["soak", "value"], rows))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
