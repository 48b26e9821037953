"""Open-loop load on an embedding server: Poisson arrivals at fixed offered rates.

    python benchmarks/load.py --url http://127.0.0.1:8080 --rates 20,40,80 --duration 20 \
        --texts .cache/snli/snli_1.0_test.jsonl --json load.json --png load.png

Open loop: each request is sent at its scheduled arrival time whether or not earlier ones
have returned (a closed loop of N clients hides overload by slowing down with the server).
Before the load, each text of the pool is embedded alone, one request at a time: the
reference every later response is checked against (cosine >= --min-cosine, and the vector
of *that* request's text, not a neighbour's in the batch). Reports per rate: throughput of
successful responses, latency p50/p90/p99, responses by HTTP code, mismatches, connection
errors; JSON plus a table, and a latency-vs-load plot.

--serve CMD starts the server itself (e.g. --serve "squant serve deploy/ --port 8080") and
stops it afterwards; the script waits for GET /ready.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shlex
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from squant.report import format_table


def read_pool(path: str, n: int, seed: int = 0) -> list[str]:
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    texts = []
    for line in lines:
        if path.endswith(".jsonl"):
            row = json.loads(line)
            texts.extend(t for t in (row.get("sentence1"), row.get("sentence2")) if t)
        elif line.strip():
            texts.append(line.strip())
    texts = sorted(set(texts))
    random.Random(seed).shuffle(texts)
    return texts[:n]


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    na = sum(x * x for x in a) ** 0.5
    nb = sum(y * y for y in b) ** 0.5
    return dot / max(na * nb, 1e-30)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, int(q / 100 * len(v)))]


async def references(client: httpx.AsyncClient, url: str, pool: list[str]) -> list[list[float]]:
    out = []
    for text in pool:  # one at a time: no batching can touch the reference
        r = await client.post(f"{url}/embed", json={"inputs": text})
        r.raise_for_status()
        out.append(r.json()[0])
    return out


async def run_rate(
    client: httpx.AsyncClient,
    url: str,
    pool: list[str],
    refs: list[list[float]],
    rate: float,
    duration: float,
    min_cosine: float,
    seed: int,
) -> dict:
    rng = random.Random(seed)
    codes: dict[str, int] = {}
    latencies: list[float] = []
    mismatches = 0
    errors = 0

    async def one(i: int) -> None:
        nonlocal mismatches, errors
        t0 = time.perf_counter()
        try:
            r = await client.post(f"{url}/embed", json={"inputs": pool[i]})
        except httpx.HTTPError:
            errors += 1
            return
        codes[str(r.status_code)] = codes.get(str(r.status_code), 0) + 1
        if r.status_code == 200:
            latencies.append(1e3 * (time.perf_counter() - t0))
            if cosine(r.json()[0], refs[i]) < min_cosine:
                mismatches += 1

    tasks = []
    start = time.perf_counter()
    t = 0.0
    while True:
        t += rng.expovariate(rate)
        if t > duration:
            break
        await asyncio.sleep(max(0.0, start + t - time.perf_counter()))
        tasks.append(asyncio.create_task(one(rng.randrange(len(pool)))))
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - start
    return {
        "offered_rps": rate,
        "sent": len(tasks),
        "throughput_rps": codes.get("200", 0) / elapsed,
        "p50_ms": percentile(latencies, 50),
        "p90_ms": percentile(latencies, 90),
        "p99_ms": percentile(latencies, 99),
        "codes": codes,
        "mismatches": mismatches,
        "connection_errors": errors,
        "seconds": elapsed,
    }


def wait_ready(url: str, timeout: float = 600.0) -> None:
    end = time.time() + timeout
    while time.time() < end:
        try:
            if httpx.get(f"{url}/ready", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    raise SystemExit(f"{url} did not become ready in {timeout:.0f} s")


async def main_async(args: argparse.Namespace) -> dict:
    pool = read_pool(args.texts, args.pool)
    limits = httpx.Limits(max_connections=args.max_connections)
    async with httpx.AsyncClient(timeout=args.timeout, limits=limits) as client:
        refs = await references(client, args.url, pool)
        rows = []
        for i, rate in enumerate(args.rates):
            rows.append(
                await run_rate(
                    client, args.url, pool, refs, rate, args.duration, args.min_cosine, i
                )
            )
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return {"url": args.url, "label": args.label, "pool": len(pool), "results": rows}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8080")
    p.add_argument("--rates", default="10,20,40", help="offered requests/s, comma list")
    p.add_argument("--duration", type=float, default=20.0, help="seconds per rate")
    p.add_argument("--texts", required=True, help=".jsonl (sentence1/2) or one text per line")
    p.add_argument("--pool", type=int, default=200, help="distinct texts (references)")
    p.add_argument("--min-cosine", type=float, default=0.999)
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--max-connections", type=int, default=512)
    p.add_argument("--serve", default=None, help="command that starts the server")
    p.add_argument("--label", default="server")
    p.add_argument("--json", default=None)
    p.add_argument("--png", default=None)
    args = p.parse_args()
    args.rates = [float(r) for r in args.rates.split(",")]
    server = subprocess.Popen(shlex.split(args.serve)) if args.serve else None
    try:
        wait_ready(args.url)
        record = asyncio.run(main_async(args))
    finally:
        if server is not None:
            server.terminate()
            server.wait(60)
    rows = [
        [
            f"{r['offered_rps']:.0f}",
            f"{r['throughput_rps']:.1f}",
            *(f"{r[k]:.0f}" if r[k] is not None else None for k in ("p50_ms", "p90_ms", "p99_ms")),
            " ".join(f"{c}:{n}" for c, n in sorted(r["codes"].items())),
            r["mismatches"],
            r["connection_errors"],
        ]
        for r in record["results"]
    ]
    print(
        f"{args.label} at {args.url}, {record['pool']} texts, open loop {args.duration:.0f} s/rate"
    )
    headers = ["offered/s", "ok/s", "p50 ms", "p90 ms", "p99 ms", "codes", "wrong", "conn err"]
    print(format_table(headers, rows))
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=2))
    if args.png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        ok = [r for r in record["results"] if r["p99_ms"] is not None]
        ax.plot([r["throughput_rps"] for r in ok], [r["p99_ms"] for r in ok], "o-", label="p99")
        ax.plot([r["throughput_rps"] for r in ok], [r["p50_ms"] for r in ok], "s--", label="p50")
        ax.set_xlabel("served requests/s")
        ax.set_ylabel("latency ms")
        ax.set_title(args.label)
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.png, dpi=120)


if __name__ == "__main__":
    main()
