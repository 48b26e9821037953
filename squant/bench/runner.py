"""Multi-instance throughput on one host: N instances x C cores, all sharing ONE model.

Instances are threads of one process calling the same compiled model: the weights exist
once in memory whatever N is (measured: the process's resident/proportional memory is
reported for 1 and N instances). Each instance pins itself to its own cores (and so to the
NUMA node they belong to) and runs its own OpenMP team of C threads: OpenMP keeps the thread
count per calling thread, and the team it creates inherits the caller's affinity. The int8
and float kernels release the GIL; what stays under it is the compiled graph's thin wrapper.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..runtime.placement import Placement, pin_current_thread
from ..runtime.timing import summarize


def memory_kib() -> dict[str, int]:
    """Resident and proportional set size of this process (Linux), KiB."""
    out = {}
    rollup = Path("/proc/self/smaps_rollup")
    if rollup.is_file():
        for line in rollup.read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("Rss", "Pss"):
                out[key.lower() + "_kib"] = int(value.split()[0])
    return out


def run(
    fn: Callable[[], Any],
    placement: Placement,
    duration_s: float = 10.0,
    warmup: int = 3,
    batch: int = 1,
) -> dict[str, Any]:
    """Every instance calls fn() in a loop for duration_s (after warm-up, all starting
    together); returns throughput (sequences/s, all instances), per-instance latency
    percentiles, the affinity each instance really had, and memory."""
    barrier = threading.Barrier(placement.instances + 1)
    samples: list[list[float]] = [[] for _ in range(placement.instances)]
    affinity: list[list[int]] = [[] for _ in range(placement.instances)]
    errors: list[BaseException] = []
    deadline = [0.0]

    def worker(i: int) -> None:
        try:
            pin_current_thread(placement.cores[i], placement.cores_per_instance)
            affinity[i] = sorted(os.sched_getaffinity(threading.get_native_id()))
            with torch.no_grad():
                for _ in range(warmup):
                    fn()
                barrier.wait()
                barrier.wait()  # released once the deadline is set
                while time.perf_counter() < deadline[0]:
                    t0 = time.perf_counter()
                    fn()
                    samples[i].append(time.perf_counter() - t0)
        except BaseException as e:
            errors.append(e)
            barrier.abort()

    threads = [
        threading.Thread(target=worker, args=(i,), daemon=True) for i in range(placement.instances)
    ]
    for t in threads:
        t.start()
    try:
        barrier.wait()  # all warmed up
        start = time.perf_counter()
        deadline[0] = start + duration_s
        barrier.wait()
    except threading.BrokenBarrierError:
        pass
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    elapsed = max(time.perf_counter() - start, 1e-9)
    calls = sum(len(s) for s in samples)
    return {
        "instances": placement.instances,
        "cores_per_instance": placement.cores_per_instance,
        "cores": [list(c) for c in placement.cores],
        "affinity_seen": affinity,
        "duration_s": elapsed,
        "calls": calls,
        "sequences_per_s": calls * batch / elapsed,
        "latency": [summarize(s).to_dict() if s else None for s in samples],
        "memory": memory_kib(),
    }
