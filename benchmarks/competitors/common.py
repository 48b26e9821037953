"""Helpers shared by the competitor setups."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from squant.runtime.outputs import first_tensor


def main_output(out: Any) -> Tensor:
    """The first tensor of a model output, as float32."""
    return first_tensor(out).float()


def compile_frozen(module: torch.nn.Module):
    """torch.compile with inductor freezing (weights as constants, oneDNN prepacking), the
    setting scoped to each call (dynamo reads it when it traces, at the first call)."""
    compiled = torch.compile(module)

    def run(**inputs: Tensor) -> Any:
        with torch.no_grad(), torch._inductor.config.patch(freezing=True):
            return compiled(**inputs)

    return run
