"""Two embedding servers, the same client, alternating rounds: squant serve against what many
users run today (a plain FastAPI + transformers FP32 server, benchmarks/baseline_server.py).

    python benchmarks/versus.py --texts .cache/snli/snli_1.0_test.jsonl \
        --a "squant serve int8/ --port 8080" --a-url http://127.0.0.1:8080 \
        --b "python benchmarks/baseline_server.py MODEL --port 8090 --threads 2" \
        --b-url http://127.0.0.1:8090 --rounds 5 --duration 20 --clients 16

Both servers are started and warmed first, then each round runs --clients closed-loop
clients (each sends its next single-sentence request when the last is answered) against A for
--duration s, then against B: drift on a shared host hits both alike, and the idle server
takes no CPU while the other is measured. Every response is checked against that server's
own answer to the text sent alone beforehand (cosine >= --min-cosine). Reports per round A/B
throughput and p99, and the median ratio, as a table plus JSON with the commit and host ISA.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.http1 import Http1Pool
from benchmarks.load import read_pool, references, run_closed, wait_ready
from squant.bench.report import format_table
from squant.provenance import provenance


async def rounds(args: argparse.Namespace, pool: list[str]) -> list[dict]:
    urls = {"a": args.a_url, "b": args.b_url}
    clients = {k: Http1Pool(u, args.clients * 2, args.timeout) for k, u in urls.items()}
    refs = {k: await references(c, pool) for k, c in clients.items()}
    out = []
    try:
        for r in range(args.rounds):
            row: dict = {"round": r + 1}
            for k in ("a", "b"):
                result = await run_closed(
                    clients[k], pool, refs[k], args.clients, args.duration, args.min_cosine, r
                )
                row[k] = result
                print(
                    f"round {r + 1} {k}: {result['throughput_rps']:.1f} req/s, "
                    f"p99 {result['p99_ms']} ms",
                    flush=True,
                )
            row["throughput_ratio"] = row["a"]["throughput_rps"] / row["b"]["throughput_rps"]
            out.append(row)
    finally:
        for c in clients.values():
            await c.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--a", default=None, help="command that starts server A (squant)")
    p.add_argument("--a-url", default="http://127.0.0.1:8080")
    p.add_argument("--b", default=None, help="command that starts server B (the baseline)")
    p.add_argument("--b-url", default="http://127.0.0.1:8090")
    p.add_argument("--texts", required=True, help=".jsonl (sentence1/2) or one text per line")
    p.add_argument("--pool", type=int, default=200, help="distinct texts (references)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--duration", type=float, default=20.0, help="seconds per server per round")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--min-cosine", type=float, default=0.999)
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    servers = [subprocess.Popen(shlex.split(c)) for c in (args.a, args.b) if c]
    try:
        for url in (args.a_url, args.b_url):
            wait_ready(url, 900.0)
        results = asyncio.run(rounds(args, read_pool(args.texts, args.pool)))
    finally:
        for s in servers:
            s.terminate()
            s.wait(60)
    ratios = [r["throughput_ratio"] for r in results]
    rows = [
        [
            r["round"],
            r["a"]["throughput_rps"],
            r["b"]["throughput_rps"],
            round(r["throughput_ratio"], 2),
            r["a"]["p99_ms"],
            r["b"]["p99_ms"],
            r["a"]["mismatches"] + r["b"]["mismatches"],
        ]
        for r in results
    ]
    headers = ["round", "A req/s", "B req/s", "A/B", "A p99 ms", "B p99 ms", "wrong"]
    print(format_table(headers, rows))
    print(f"median A/B {statistics.median(ratios):.2f}x, lowest {min(ratios):.2f}x")
    if args.json:
        record = {
            "a": args.a,
            "b": args.b,
            "clients": args.clients,
            "duration_s": args.duration,
            "rounds": results,
            "median_ratio": statistics.median(ratios),
            "min_ratio": min(ratios),
            "provenance": provenance(),
        }
        Path(args.json).write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
