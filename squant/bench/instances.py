"""One batch split across N pinned instances of ONE model, run at once: how a throughput
layout (N instances x C cores) serves a single request of many rows, timed like any other
variant. OpenVINO's THROUGHPUT hint does the same with its streams (the rows of a batch go
to its infer requests), so the two are compared call for call.

Each instance is a long-lived thread pinned to its cores with its own OpenMP team of C
threads (runtime/placement.py); the model's weights exist once. The int8 and float kernels
release the GIL, so the instances' kernels overlap; what stays under it is the compiled
graph's thin wrapper."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from ..errors import SquantError
from ..runtime.placement import Placement, pin_current_thread

Inputs = Mapping[str, Tensor]


def split_rows(inputs: Inputs, parts: int) -> list[dict[str, Tensor]]:
    """The batch cut into `parts` consecutive slices of rows, as equal as the batch allows
    (the first ones one row larger); fewer slices where there are fewer rows."""
    rows = next(iter(inputs.values())).shape[0]
    if rows < 1:
        raise SquantError("cannot split an empty batch across instances")
    n = min(parts, rows)
    sizes = [rows // n + (1 if i < rows % n else 0) for i in range(n)]
    out, start = [], 0
    for size in sizes:
        out.append({k: v[start : start + size] for k, v in inputs.items()})
        start += size
    return out


class InstancePool:
    """Calls `fn(inputs) -> Tensor` on each instance's share of the rows at once and joins
    the results in row order. Use as a context manager (or call close()) to end the threads."""

    def __init__(self, fn: Callable[[Inputs], Tensor], placement: Placement) -> None:
        self.fn = fn
        self.placement = placement
        self._jobs: list[queue.SimpleQueue[Any]] = []
        self._done: queue.SimpleQueue[tuple[int, Any]] = queue.SimpleQueue()
        self._threads = []
        for i in range(placement.instances):
            jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
            t = threading.Thread(target=self._serve, args=(i, jobs), daemon=True)
            self._jobs.append(jobs)
            self._threads.append(t)
            t.start()

    def _serve(self, index: int, jobs: queue.SimpleQueue[Any]) -> None:
        pin_current_thread(self.placement.cores[index], self.placement.cores_per_instance)
        with torch.no_grad():
            while (job := jobs.get()) is not None:
                try:
                    self._done.put((job[0], self.fn(job[1])))
                except BaseException as e:  # handed to the caller, who raises it
                    self._done.put((job[0], e))

    def __call__(self, inputs: Inputs) -> Tensor:
        shares = split_rows(inputs, self.placement.instances)
        for i, share in enumerate(shares):
            self._jobs[i].put((i, share))
        results: dict[int, Any] = dict(self._done.get() for _ in shares)
        for r in results.values():
            if isinstance(r, BaseException):
                raise r
        return torch.cat([results[i] for i in range(len(shares))])

    def close(self) -> None:
        for jobs in self._jobs:
            jobs.put(None)
        for t in self._threads:
            t.join()

    def __enter__(self) -> InstancePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
