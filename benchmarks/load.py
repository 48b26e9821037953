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

--closed N measures the peak instead: N clients, each sending its next request when its last
returns (nobody is refused, so no CPU goes to 429s), for comparison with `squant bench`.

--serve CMD starts the server itself (e.g. --serve "squant serve deploy/ --port 8080") and
stops it afterwards; the script waits for GET /ready.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import shlex
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.http1 import Http1Pool, HTTPError
from squant.bench.report import format_table


def read_pool(path: str, n: int, seed: int = 0, join: int = 1) -> list[str]:
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
    if join > 1:  # longer inputs: `join` texts end to end
        texts = [" ".join(texts[i : i + join]) for i in range(0, len(texts) - join + 1, join)]
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


async def references(client: Http1Pool, pool: list[str]) -> list[list[float]]:
    out = []
    for text in pool:  # one at a time: no batching can touch the reference
        r = await client.post_json("/embed", {"inputs": text})
        if r.status_code != 200:
            raise SystemExit(f"reference request failed: HTTP {r.status_code} {r.text[:200]}")
        out.append(r.json()[0])
    return out


async def send_one(
    client: Http1Pool,
    text: str,
    ref: list[float],
    rec: dict,
    min_cosine: float,
    start: float,
) -> None:
    """One request; its code, latency, finish time and whether it matched go into rec.
    Latency counts from rec["t"], when the request was due (its arrival time), not from
    when the client got round to sending it: waiting for a connection is the server's
    latency too, as a user sees it."""
    t0 = start + rec["t"]
    try:
        r = await client.post_json("/embed", {"inputs": text})
    except HTTPError as e:
        rec["error"] = str(e).split(":")[0]  # the kind: ConnectionResetError, TimeoutError...
        return
    rec["code"] = r.status_code
    rec["ms"] = 1e3 * (time.perf_counter() - t0)
    rec["done"] = round(time.perf_counter() - start, 4)
    if r.status_code == 200:
        rec["match"] = cosine(r.json()[0], ref) >= min_cosine


async def run_closed(
    client: Http1Pool,
    pool: list[str],
    refs: list[list[float]],
    clients: int,
    duration: float,
    min_cosine: float,
    seed: int,
) -> dict:
    """Saturation: `clients` senders, each sending its next request as soon as its last is
    answered, for `duration` s. The server always has work and nobody is refused, so the
    throughput is its peak, comparable with `squant bench` at the same batch shape."""
    rng = random.Random(seed)
    records: list[dict] = []
    start = time.perf_counter()
    end = start + duration

    async def sender() -> None:
        while time.perf_counter() < end:
            i = rng.randrange(len(pool))
            rec = {"t": round(time.perf_counter() - start, 4), "phase": 0}
            records.append(rec)
            await send_one(client, pool[i], refs[i], rec, min_cosine, start)

    await asyncio.gather(*(sender() for _ in range(clients)))
    return {**summarize(records, 0.0, duration), "clients": clients}


async def run_phases(
    client: Http1Pool,
    pool: list[str],
    refs: list[list[float]],
    phases: list[tuple[float, float]],
    min_cosine: float,
    seed: int,
) -> list[dict]:
    """Poisson arrivals at each phase's (rate, seconds) in turn, open loop; one record per
    request: when it was sent (s since start), its phase, code, latency, and whether its
    vector matched its own text's reference."""
    rng = random.Random(seed)
    sent: list[dict] = []

    async def one(i: int, rec: dict) -> None:
        await send_one(client, pool[i], refs[i], rec, min_cosine, start)

    tasks = []
    start = time.perf_counter()
    t, phase_end = 0.0, 0.0
    for phase, (rate, seconds) in enumerate(phases):
        phase_start, phase_end = phase_end, phase_end + seconds
        t = max(t, phase_start)
        while True:
            t += rng.expovariate(rate)
            if t > phase_end:
                t = phase_end
                break
            await asyncio.sleep(max(0.0, start + t - time.perf_counter()))
            rec = {"t": round(t, 4), "phase": phase}
            sent.append(rec)
            tasks.append(asyncio.create_task(one(rng.randrange(len(pool)), rec)))
    await asyncio.gather(*tasks)
    return sent


def summarize(records: list[dict], rate: float, seconds: float) -> dict:
    """Per phase. Throughput is 200s over the time from the phase's first send to its last
    answer: a server that queues without bound answers everything eventually, so dividing
    by the sending time alone would report the offered rate."""
    codes: dict[str, int] = {}
    for r in records:
        if "code" in r:
            codes[str(r["code"])] = codes.get(str(r["code"]), 0) + 1
    latencies = [r["ms"] for r in records if r.get("code") == 200]
    start = min((r["t"] for r in records), default=0.0)
    end = max((r["done"] for r in records if "done" in r), default=start + seconds)
    elapsed = max(end - start, seconds)
    return {
        "offered_rps": rate,
        "sent": len(records),
        "throughput_rps": codes.get("200", 0) / elapsed,
        "p50_ms": percentile(latencies, 50),
        "p90_ms": percentile(latencies, 90),
        "p99_ms": percentile(latencies, 99),
        "codes": codes,
        "mismatches": sum(1 for r in records if r.get("match") is False),
        "connection_errors": sum(1 for r in records if "error" in r),
        "errors": dict(Counter(r["error"] for r in records if "error" in r)),
        "seconds": elapsed,
    }


async def run_rate(
    client: Http1Pool,
    pool: list[str],
    refs: list[list[float]],
    rate: float,
    duration: float,
    min_cosine: float,
    seed: int,
) -> dict:
    records = await run_phases(client, pool, refs, [(rate, duration)], min_cosine, seed)
    return summarize(records, rate, duration)


def wait_ready(url: str, timeout: float = 600.0) -> None:
    end = time.time() + timeout
    while time.time() < end:
        try:
            with urllib.request.urlopen(f"{url}/ready", timeout=2.0) as r:
                if r.status == 200:
                    return
        except (OSError, ValueError):  # refused, 503 (HTTPError), timeout
            pass
        time.sleep(1.0)
    raise SystemExit(f"{url} did not become ready in {timeout:.0f} s")


class MemorySampler:
    """Resident memory of a process and its children (VmRSS, and PSS from smaps_rollup when
    readable, summed) every `every` seconds, in a thread: is the server's memory flat under
    load?"""

    def __init__(self, pid: int | None, every: float = 0.5) -> None:
        self.pid, self.every = pid, every
        self.samples: list[dict] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._t0 = time.perf_counter()

    def _tree(self) -> list[int]:
        """The process and its descendants (a server with a model process is two, plus
        multiprocessing's resource tracker): memory is summed over all of them."""
        pids, i = [self.pid], 0
        while i < len(pids):
            for task in Path(f"/proc/{pids[i]}/task").glob("*/children"):
                with contextlib.suppress(OSError):
                    pids += [int(c) for c in task.read_text().split()]
            i += 1
        return pids

    def _read(self) -> dict | None:
        out: dict = {"t": round(time.perf_counter() - self._t0, 2)}
        try:
            pids = self._tree()
        except OSError:
            return None
        for pid in pids:
            for name, key in (("status", "VmRSS:"), ("smaps_rollup", "Pss:")):
                try:
                    text = Path(f"/proc/{pid}/{name}").read_text()
                except OSError:
                    if pid == self.pid:
                        return None
                    continue
                for line in text.splitlines():
                    if line.startswith(key):
                        k = key.rstrip(":").lower() + "_mib"
                        out[k] = out.get(k, 0.0) + int(line.split()[1]) / 1024
                        if k == "vmrss_mib":  # each process's share, the server's first
                            out.setdefault("vmrss_by_process_mib", []).append(
                                round(int(line.split()[1]) / 1024, 1)
                            )
        out["processes"] = len(pids)
        return out

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            sample = self._read()
            if sample is not None:
                self.samples.append(sample)

    def __enter__(self) -> MemorySampler:
        self._t0 = time.perf_counter()
        if self.pid is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


def burst_report(
    records: list[dict], phases: list[tuple[float, float]], memory: list[dict]
) -> dict:
    """Before / during / after an overload burst: codes, lost and mismatched requests, p99 per
    second, how long p99 took to come back, and memory per phase."""
    base_seconds, burst_seconds, _ = (p[1] for p in phases)
    by_phase = [[r for r in records if r["phase"] == i] for i in range(3)]
    summary = [summarize(rs, rate, sec) for rs, (rate, sec) in zip(by_phase, phases, strict=True)]
    base_p99 = summary[0]["p99_ms"] or 0.0
    # p99 of the requests sent in each second after the burst; "back" = from the first second
    # whose p99 (and every later one's) is within 1.5x the pre-burst p99
    end = base_seconds + burst_seconds
    per_second = []
    for k in range(int(phases[2][1])):
        window = [
            r["ms"] for r in by_phase[2] if r.get("code") == 200 and end + k <= r["t"] < end + k + 1
        ]
        per_second.append(percentile(window, 99))
    ok = [p is None or p <= 1.5 * base_p99 for p in per_second]
    back = next((k for k in range(len(ok)) if all(ok[k:])), None)
    mem = {}
    for name, lo, hi in (("before", 0, base_seconds), ("burst", base_seconds, end)):
        rss = [m["vmrss_mib"] for m in memory if lo <= m["t"] < hi and "vmrss_mib" in m]
        mem[name] = {"min": min(rss), "max": max(rss)} if rss else None
    rss_after = [m["vmrss_mib"] for m in memory if m["t"] >= end and "vmrss_mib" in m]
    mem["after"] = {"min": min(rss_after), "max": max(rss_after)} if rss_after else None
    burst_codes = summary[1]["codes"]
    return {
        "phases": summary,
        "burst_codes": burst_codes,
        "unexpected_codes": sorted(c for c in burst_codes if c not in ("200", "429", "504")),
        "lost": sum(s["connection_errors"] for s in summary),
        "mismatches": sum(s["mismatches"] for s in summary),
        "p99_after_per_second_ms": per_second,
        "p99_back_within_1_5x_after_s": back,
        "memory_mib": mem,
    }


SERVER_COUNTERS = (
    "squant_batches_total",
    "squant_sequences_total",
    "squant_padded_tokens_total",
    "squant_inference_seconds_total",
)


async def server_counters(client: Http1Pool) -> dict[str, float]:
    """squant serve's own batch counters from /metrics ({} from a server without them)."""
    try:
        text = (await client.get("/metrics")).text
    except HTTPError:
        return {}
    values = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in SERVER_COUNTERS:
            values[name] = float(value)
    return values


def batch_shape(before: dict[str, float], after: dict[str, float], seconds: float) -> dict:
    """The batches the server formed meanwhile: what `squant bench` should be run at to
    compare like with like (mean sequences per batch, mean padded width)."""
    if len(before) < len(SERVER_COUNTERS) or len(after) < len(SERVER_COUNTERS):
        return {}
    d = {k: after[k] - before[k] for k in SERVER_COUNTERS}
    if d["squant_batches_total"] <= 0:
        return {}
    return {
        "batches": int(d["squant_batches_total"]),
        "mean_batch": d["squant_sequences_total"] / d["squant_batches_total"],
        "mean_width": d["squant_padded_tokens_total"] / d["squant_sequences_total"],
        "inference_busy": d["squant_inference_seconds_total"] / seconds,
    }


async def main_async(args: argparse.Namespace, pid: int | None) -> dict:
    pool = read_pool(args.texts, args.pool, join=args.join)
    async with Http1Pool(args.url, args.max_connections, args.timeout) as client:
        refs = await references(client, pool)
        if args.burst:
            base = args.rates[0]
            phases = [(base, args.duration), (args.burst, args.burst_seconds)]
            phases.append((base, args.duration))
            with MemorySampler(pid) as mem:
                records = await run_phases(client, pool, refs, phases, args.min_cosine, 0)
            report = burst_report(records, phases, mem.samples)
            return {"url": args.url, "label": args.label, "pool": len(pool), "burst": report}
        if args.closed:
            # a short unmeasured run first: connections open, every batch shape seen
            await run_closed(client, pool, refs, args.closed, 3.0, 0.0, 99)
            before = await server_counters(client)
            row = await run_closed(
                client, pool, refs, args.closed, args.duration, args.min_cosine, 0
            )
            shape = batch_shape(before, await server_counters(client), args.duration)
            if shape:
                row["server_batches"] = shape
                print(
                    f"server batches: {shape['batches']}, mean {shape['mean_batch']:.2f} "
                    f"sequences x {shape['mean_width']:.1f} padded tokens, inference busy "
                    f"{shape['inference_busy']:.0%} of the time",
                    flush=True,
                )
            return {"url": args.url, "label": args.label, "pool": len(pool), "results": [row]}
        rows = []
        for i, rate in enumerate(args.rates):
            rows.append(await run_rate(client, pool, refs, rate, args.duration, args.min_cosine, i))
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
    p.add_argument("--join", type=int, default=1, help="texts joined into one input (longer)")
    p.add_argument(
        "--burst",
        type=float,
        default=0.0,
        help="overload test: the first --rates for --duration s, this rate for --burst-seconds, "
        "the first rate again; reports codes, lost, p99 recovery and server memory",
    )
    p.add_argument("--burst-seconds", type=float, default=60.0)
    p.add_argument(
        "--closed",
        type=int,
        default=0,
        help="closed loop instead: N clients back to back for --duration s (peak throughput)",
    )
    p.add_argument("--server-pid", type=int, default=None, help="memory of this process")
    p.add_argument("--label", default="server")
    p.add_argument("--json", default=None)
    p.add_argument("--png", default=None)
    args = p.parse_args()
    args.rates = [float(r) for r in args.rates.split(",")]
    server = subprocess.Popen(shlex.split(args.serve)) if args.serve else None
    pid = server.pid if server is not None else args.server_pid
    try:
        wait_ready(args.url)
        record = asyncio.run(main_async(args, pid))
    finally:
        if server is not None:
            server.terminate()
            server.wait(60)
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=2))
    if "burst" in record:
        print_burst(record, args)
        return
    rows = [
        [
            f"closed {r['clients']}" if "clients" in r else f"{r['offered_rps']:.0f}",
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


def print_burst(record: dict, args: argparse.Namespace) -> None:
    b = record["burst"]
    rows = [
        [
            name,
            f"{s['offered_rps']:.0f}",
            f"{s['throughput_rps']:.1f}",
            *(f"{s[k]:.0f}" if s[k] is not None else None for k in ("p50_ms", "p99_ms")),
            " ".join(f"{c}:{n}" for c, n in sorted(s["codes"].items())),
            s["mismatches"],
            s["connection_errors"],
            (lambda m: f"{m['min']:.0f}-{m['max']:.0f}" if m else None)(b["memory_mib"][key]),
        ]
        for name, key, s in zip(
            ("before", "burst", "after"), ("before", "burst", "after"), b["phases"], strict=True
        )
    ]
    print(f"{args.label} at {args.url}: overload burst, {record['pool']} texts (join {args.join})")
    headers = [
        "phase",
        "offered/s",
        "ok/s",
        "p50 ms",
        "p99 ms",
        "codes",
        "wrong",
        "lost",
        "RSS MiB",
    ]
    print(format_table(headers, rows))
    print(
        f"unexpected codes during the burst: {b['unexpected_codes'] or 'none'}; lost {b['lost']}; "
        f"mismatched {b['mismatches']}; p99 back within 1.5x of before after "
        f"{b['p99_back_within_1_5x_after_s']} s"
    )


if __name__ == "__main__":
    main()
