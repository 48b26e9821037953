"""Inductor's C++ wrapper against its Python wrapper for one squant.compile'd model.

    python benchmarks/cpp_wrapper.py [--model distilbert-base-uncased] [--seq 256] [--rounds 30]

Static INT8 of the named architecture (random weights: speed does not depend on values),
compiled twice with FP32 float parts: CompileConfig(cpp_wrapper=False) and (True). Both are
built first, then timed in interleaved rounds at batch 1 (all this process's threads);
then each is called from 1 and from 2 threads at once (1 OpenMP thread each, every thread
warmed first: a new thread count recompiles), to show whether calls run concurrently
(the C++ wrapper releases the GIL for the whole call).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import squant
from squant.bench.configs import random_calibration, random_inputs, random_model
from squant.bench.report import format_table
from squant.runtime.compiler import CompileConfig


def concurrent_rate(compiled, inputs, threads: int, calls: int = 6) -> float:
    start, done = threading.Barrier(threads + 1), threading.Barrier(threads + 1)

    def loop() -> None:
        torch.set_num_threads(1)
        with torch.no_grad():
            compiled(**inputs)  # warm this thread (and its thread count)
            compiled(**inputs)
            start.wait()
            for _ in range(calls):
                compiled(**inputs)
        done.wait()

    workers = [threading.Thread(target=loop) for _ in range(threads)]
    for w in workers:
        w.start()
    start.wait()
    t0 = time.perf_counter()
    done.wait()
    elapsed = time.perf_counter() - t0
    for w in workers:
        w.join()
    return threads * calls / elapsed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="distilbert-base-uncased")
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--rounds", type=int, default=30)
    args = p.parse_args()
    model = random_model(args.model)
    q = squant.quantize(
        model, squant.SmoothQuantConfig(), random_calibration(model), progress=False
    )
    inputs = random_inputs(q, 1, args.seq)
    built, build_s = {}, {}
    for name, cpp in (("python wrapper", False), ("C++ wrapper", True)):
        torch._dynamo.reset()
        t0 = time.perf_counter()
        config = CompileConfig(float_dtype="fp32", attention="squant", cpp_wrapper=cpp)
        built[name] = squant.compile(q, config, inputs)
        build_s[name] = time.perf_counter() - t0
    ms: dict[str, list[float]] = {n: [] for n in built}
    with torch.no_grad():
        for _ in range(args.rounds):
            for n, c in built.items():
                t0 = time.perf_counter()
                c(**inputs)
                ms[n].append(1e3 * (time.perf_counter() - t0))
    rows = []
    for n, c in built.items():
        one, two = concurrent_rate(c, inputs, 1), concurrent_rate(c, inputs, 2)
        t = sorted(ms[n])
        rows.append(
            [
                n,
                f"{build_s[n]:.1f}",
                f"{statistics.median(t):.1f}",
                f"{t[int(0.9 * len(t))]:.1f}",
                f"{one:.2f}",
                f"{two:.2f}",
                f"{two / one:.2f}x",
            ]
        )
    print(f"{args.model} static INT8, bs 1, seq {args.seq}, {torch.get_num_threads()} threads")
    headers = ["wrapper", "build s", "median ms", "p90 ms", "1 thread f/s", "2 threads f/s"]
    print(format_table([*headers, "2 vs 1"], rows))


if __name__ == "__main__":
    main()
