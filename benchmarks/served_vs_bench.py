"""Served throughput against `squant bench`, interleaved: is the server's overhead
bounded? (served >= 0.85x of bench at the same model, batch shape and instance layout).

    python benchmarks/served_vs_bench.py int8/ --texts .cache/snli/snli_1.0_test.jsonl \
        --instances 1 --cores-per-instance 1 --rounds 6 --json served_vs_bench.json

This host drifts by 10-30% within minutes, so two separate runs (bench, then the server) do
not give a ratio. Here both stay loaded and take turns in short windows on the same cores:
1. `squant serve MODEL` starts (compiled, as served by default) and a closed loop of
   --clients clients learns the batches it forms (mean sequences x padded width).
2. A bench process compiles the same weights as `squant bench --variants static-compiled`
   does (squant.compile, static shapes) at that shape: round(mean batch) x the bucket, a
   padded batch of the same texts, and waits.
3. Rounds: bench runs --window s (bench/runner.run, the instance layout of the server), then
   the server serves a closed loop for --window s; the other side idles meanwhile. Each
   round's ratio is served requests/s (one sequence each) over bench sequences/s.
The load generator (this process) runs on the cores no instance uses when there are any,
where `squant serve` also puts its HTTP front end.

--variants in-process,model-process starts one server per variant (`--model-process`: the
model in a child process, engine/model_process.py), all loaded at once; each round then runs
bench and every server's window in turn (their order rotating), so each gets its own ratio
against the same bench windows.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.http1 import Http1Pool
from benchmarks.load import (
    batch_shape,
    read_pool,
    references,
    run_closed,
    server_counters,
    wait_ready,
)
from squant.bench.report import format_table

# the server variants: extra `squant serve` flags
VARIANTS = {
    "in-process": ["--model-process", "off"],
    "model-process": ["--model-process", "on"],
}


def bench_helper(args: argparse.Namespace) -> None:
    """The bench side: compile at the shape, then one bench window per line on stdin."""
    import torch

    import squant
    from squant.bench.runner import plan, run
    from squant.checkpoint.models import load_tokenizer
    from squant.checkpoint.sentence_transformer import inner_model, is_sentence_transformer
    from squant.quant.mappings import model_inputs
    from squant.runtime.compiler import CompileConfig

    loaded = squant.load(args.model)
    model = inner_model(loaded) if is_sentence_transformer(loaded) else loaded
    tok = load_tokenizer(args.model)
    texts = read_pool(args.texts, args.batch, join=args.join)
    enc = tok(
        texts, padding="max_length", truncation=True, max_length=args.seq, return_tensors="pt"
    )
    inputs = model_inputs(model, dict(enc))
    placement = plan(args.instances, args.cores_per_instance)
    torch.set_num_threads(placement.cores_per_instance)
    compiled = squant.compile(model, CompileConfig(), example_inputs=inputs)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        seconds = float(line)
        result = run(lambda: compiled(**inputs), placement, seconds, batch=args.batch)
        print(json.dumps({"sequences_per_s": result["sequences_per_s"]}), flush=True)


async def served_window(url: str, pool: list[str], refs: list, args: argparse.Namespace) -> dict:
    async with Http1Pool(url, args.clients, 60.0) as client:
        await run_closed(client, pool, refs, args.clients, 1.0, 0.0, 99)  # connections open
        before = await server_counters(client)
        row = await run_closed(client, pool, refs, args.clients, args.window, 0.999, 0)
        row["server_batches"] = batch_shape(before, await server_counters(client), args.window)
    return row


def wait_server(server: subprocess.Popen, url: str, log: Path, timeout: float = 900.0) -> None:
    """Until the server answers /ready; a server that exits meanwhile ends the run with the
    tail of its log (a server that died showed only as a 600 s wait before)."""
    end = time.time() + timeout
    while time.time() < end:
        if server.poll() is not None:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
            raise SystemExit(f"the server at {url} exited ({server.returncode}):\n{tail}")
        try:
            wait_ready(url, timeout=2.0)
            return
        except SystemExit:
            pass
    raise SystemExit(f"{url} did not become ready in {timeout:.0f} s (log: {log})")


async def reference_vectors(url: str, pool: list[str]) -> list:
    async with Http1Pool(url, 1, 60.0) as client:
        return await references(client, pool)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", help="a directory from squant quantize")
    p.add_argument("--texts", required=True)
    p.add_argument("--join", type=int, default=2, help="texts joined into one input")
    p.add_argument("--pool", type=int, default=200)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--instances", type=int, default=1)
    p.add_argument("--cores-per-instance", type=int, default=1)
    p.add_argument("--max-batch-requests", type=int, default=8)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--window", type=float, default=10.0, help="seconds per side per round")
    p.add_argument("--port", type=int, default=18090)
    p.add_argument("--json")
    p.add_argument(
        "--variants",
        default="in-process",
        help=f"servers to compare, comma-separated: {', '.join(VARIANTS)}",
    )
    p.add_argument("--helper", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--batch", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--seq", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.helper:
        bench_helper(args)
        return

    from squant.bench.runner import plan
    from squant.engine.config import BUCKETS
    from squant.runtime.placement import pin_front_end

    placement = plan(args.instances, args.cores_per_instance)
    url = f"http://127.0.0.1:{args.port}"
    layout = [
        "--instances",
        str(args.instances),
        "--cores-per-instance",
        str(args.cores_per_instance),
    ]
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown or not names:
        raise SystemExit(f"unknown variants {unknown}; choose from {list(VARIANTS)}")
    urls = {n: f"http://127.0.0.1:{args.port + i}" for i, n in enumerate(names)}
    servers = []
    helper = None
    try:
        for i, name in enumerate(names):  # one at a time: two compiles at once fight for cores
            command = [sys.executable, "-m", "squant.cli", "serve", args.model]
            command += ["--port", str(args.port + i), *layout, *VARIANTS[name]]
            command += ["--max-batch-requests", str(args.max_batch_requests)]
            log = Path(tempfile.gettempdir()) / f"served_vs_bench_{name}_{args.port + i}.log"
            with log.open("w") as out:
                servers.append(subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT))
            wait_server(servers[-1], urls[name], log)
        url = urls[names[0]]
        # the load generator beside the server's front end, off the instances' cores
        spare = pin_front_end(placement)
        pool = read_pool(args.texts, args.pool, join=args.join)
        # each server's answers are checked against its own single-request answers: two
        # compiles may time their way to different attention/GEMM kernels, and then agree
        # only to cosine ~0.9988 on some texts (each within 0.996 of FP32; docs/serving.md)
        refs = {n: asyncio.run(reference_vectors(u, pool)) for n, u in urls.items()}
        first = asyncio.run(served_window(url, pool, refs[names[0]], args))
        shape = first["server_batches"]
        batch = max(1, round(shape["mean_batch"]))
        seq = next(b for b in BUCKETS if b >= shape["mean_width"] - 0.5)
        print(
            f"server forms {shape['mean_batch']:.2f} x {shape['mean_width']:.1f}: "
            f"bench at {batch} x {seq}"
        )
        helper = subprocess.Popen(
            [sys.executable, __file__, args.model, "--helper", "--texts", args.texts,
             "--join", str(args.join), "--batch", str(batch), "--seq", str(seq), *layout],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        assert helper.stdin is not None and helper.stdout is not None
        if not json.loads(helper.stdout.readline() or "{}").get("ready"):
            raise SystemExit("the bench helper failed to compile")
        rows = []
        for r in range(args.rounds):
            helper.stdin.write(f"{args.window}\n")
            helper.stdin.flush()
            bench = json.loads(helper.stdout.readline())["sequences_per_s"]
            order = names[r % len(names) :] + names[: r % len(names)]  # rotate who goes first
            for name in order:
                served = asyncio.run(served_window(urls[name], pool, refs[name], args))
                rows.append(
                    {
                        "round": r + 1,
                        "variant": name,
                        "bench_seq_per_s": bench,
                        "served_req_per_s": served["throughput_rps"],
                        "ratio": served["throughput_rps"] / bench,
                        "p99_ms": served["p99_ms"],
                        "mismatches": served["mismatches"],
                        "codes": served["codes"],
                        "server_batches": served["server_batches"],
                    }
                )
                print(
                    f"round {r + 1}: bench {bench:.1f} seq/s, {name} served "
                    f"{served['throughput_rps']:.1f} req/s -> {rows[-1]['ratio']:.3f}x",
                    flush=True,
                )
    finally:
        if helper is not None:
            helper.kill()
        for server in servers:
            server.terminate()
            server.wait(60)
    by_variant = {n: [row["ratio"] for row in rows if row["variant"] == n] for n in names}
    ratios = by_variant[names[0]]
    summary = {
        "model": args.model,
        "layout": f"{args.instances}x{args.cores_per_instance}",
        "front_end_and_client_cores": list(spare),
        "bench_shape": [batch, seq],
        "first_window_batches": shape,
        "rounds": rows,
        "ratio_median": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "variants": {
            n: {"median": statistics.median(v), "min": min(v), "max": max(v)}
            for n, v in by_variant.items()
        },
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    table = [
        [str(r["round"]), r["variant"], f"{r['bench_seq_per_s']:.1f}",
         f"{r['served_req_per_s']:.1f}",
         f"{r['ratio']:.3f}", f"{r['server_batches'].get('mean_batch', 0):.2f}",
         f"{r['p99_ms']:.0f}", str(r["mismatches"])]
        for r in rows
    ]  # fmt: skip
    print(
        format_table(
            ["round", "server", "bench seq/s", "served req/s", "ratio", "batch", "p99 ms", "wrong"],
            table,
        )
    )
    for n, v in by_variant.items():
        print(
            f"{n} served / bench: median {statistics.median(v):.3f}x "
            f"(min {min(v):.3f}, max {max(v):.3f})"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
