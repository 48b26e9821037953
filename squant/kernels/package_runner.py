"""An AOTInductor package run through squant's kernel library, with the GIL released.

torch's own Python binding (torch._inductor.package.load_package) keeps the GIL for the whole
forward: beside it a Python thread ran at 2% of its speed, and two serving threads on one
package took turns (15 calls in 3 s with two threads vs 16 with one). Through the dispatcher
(`torch.ops.squant.run_package`) the call releases the GIL like an eager op: the Python thread
ran at full speed, and two threads made 31 calls vs 17 (real all-MiniLM-L6-v2 INT8, 8 x 128,
one core each, AVX2 host)."""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import Tensor

from . import registered_op


def available() -> bool:
    """Whether the loaded kernel library has the package runner (a library shipped in a deploy
    directory by an older squant does not)."""
    return registered_op("squant::run_package")


class NativePackageRunner:
    """runner(*inputs) -> list of output tensors, like torch's loader; num_runners calls may
    run at once, sharing one copy of the weights. The package is freed with this object."""

    def __init__(self, package_path: str, num_runners: int) -> None:
        self.handle = int(torch.ops.squant.load_package(package_path, num_runners))
        freed = weakref.finalize(self, torch.ops.squant.free_package, self.handle)
        # not at interpreter exit: torch may be half torn down by then (the process's exit
        # releases the memory anyway)
        freed.atexit = False  # type: ignore[misc]

    def __call__(self, *inputs: Tensor) -> Any:
        return torch.ops.squant.run_package(self.handle, list(inputs))
