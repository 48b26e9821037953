"""Which cores each model instance runs on: N instances x C cores, filling NUMA nodes in
order (an instance never straddles two), and what is left for a front end. Shared by the
benchmarks (bench/runner.py), the server and bulk embedding: serving places its workers the
way the throughput it is measured against was placed."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..errors import SquantError
from ..hardware import cpu_features


def allowed_cores() -> list[int]:
    """The CPU ids this process may run on ([] where the OS cannot say)."""
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []


def core_slots(width: int, cores: Sequence[int] | None = None) -> list[tuple[int, ...]]:
    """`cores` (default: this process's allowed CPUs) cut in order into consecutive slots of
    `width` cores; a remainder too small for a slot is left out. The one place squant slices
    cores: instances, Ray replicas and Ray Data actors all take slots of it."""
    cores = allowed_cores() if cores is None else list(cores)
    return [
        tuple(cores[start : start + width]) for start in range(0, len(cores) - width + 1, width)
    ]


@dataclass(frozen=True)
class Placement:
    instances: int
    cores_per_instance: int
    cores: tuple[tuple[int, ...], ...]  # CPU ids of each instance


def plan(instances: int | None, cores_per_instance: int | None) -> Placement:
    """Cores for each instance, filling NUMA nodes in order; defaults follow the paper's
    launch strategy scaled to this host (C = 4 cores, or fewer on small hosts; N = cores / C)."""
    cpu = cpu_features()
    available = allowed_cores()
    nodes = [tuple(c for c in node if c in available) for node in cpu.numa_nodes] or [
        tuple(available)
    ]
    total = sum(len(n) for n in nodes)
    c = cores_per_instance or max(1, min(4, total // 2 if total > 1 else 1))
    n = instances or max(1, total // c)
    if c < 1 or n < 1:
        raise SquantError("instances and cores per instance must be >= 1")
    if n * c > total:
        raise SquantError(f"{n} instances x {c} cores need {n * c} cores; this process has {total}")
    # an instance never straddles two NUMA nodes
    groups = [slot for node in nodes for slot in core_slots(c, node)][:n]
    if len(groups) < n:
        raise SquantError(f"cannot place {n} instances of {c} cores within NUMA nodes {nodes}")
    return Placement(n, c, tuple(groups))


def front_end_cores(placement: Placement) -> tuple[int, ...]:
    """The cores of this process that no instance uses; () when they use all (or off Linux)."""
    if not hasattr(os, "sched_getaffinity"):
        return ()
    used = {c for group in placement.cores for c in group}
    return tuple(sorted(set(os.sched_getaffinity(0)) - used))


def pin_current_thread(cores: Sequence[int], threads: int | None = None) -> None:
    """Run the calling thread (and the threads it starts afterwards, which inherit it) on
    `cores`, and with `threads`, size torch's intra-op pool to match. The one place squant
    pins: a no-op for no cores, and off Linux (no affinity call there)."""
    if cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(threading.get_native_id(), cores)
    if threads is not None:
        torch.set_num_threads(threads)


def pin_front_end(placement: Placement) -> tuple[int, ...]:
    """Move the calling thread, and the threads it starts afterwards (uvicorn's event loop
    runs on it; asyncio's tokenizer pool is started from it), onto the cores no instance
    uses, so HTTP, JSON and tokenization stay off the model's cores. Returns those cores; ()
    when the instances use every core (the front end then shares them) or off Linux. Call it
    after Engine.start: the workers pin themselves, and warm-up runs on the calling thread."""
    spare = front_end_cores(placement)
    pin_current_thread(spare)
    return spare
