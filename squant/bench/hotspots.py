"""Where the time goes in a compiled model (the paper's Table 3), from the PyTorch profiler.

Categories: Linear block (GEMMs with weights and their fused epilogues / quantize steps),
Attention (scores, softmax, context), LayerNorm (incl. fused residual add + quantize), Other.
Inductor kernels are named after the ops they fuse, which is what the rules below read.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch

CATEGORIES = ("linear", "attention", "layernorm", "other")

# (category, pattern on the profiler event name); first match wins
RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    # squant::int8_attention is squant's whole attention block (Q·Kᵀ, softmax and P·V);
    # squant::int8_linear_attention is that block with its Q|K|V GEMM in one call
    (
        "attention",
        re.compile(
            r"scaled_dot_product|_softmax|softmax|bmm|baddbmm|int8_attention|linear_attention"
        ),
    ),
    ("layernorm", re.compile(r"layer_norm|native_layer_norm")),
    (
        "linear",
        re.compile(r"qlinear|_linear_pointwise|linear|addmm|\bmm\b|aten::mm|gelu|quantize|round"),
    ),
)
# Events that only wrap others (their self time is framework overhead, counted as other).
WRAPPERS = re.compile(r"CompiledFxGraph|Torch-Compiled Region|TorchDynamo|AOTDispatcher|Pregraph")


def categorize(name: str) -> str:
    if WRAPPERS.search(name):
        return "other"
    for category, pattern in RULES:
        if pattern.search(name):
            return category
    return "other"


def breakdown(self_times_us: dict[str, float]) -> dict[str, float]:
    """Percent of total self time per category, from {event name: self time}."""
    totals: dict[str, float] = defaultdict(float)
    for name, t in self_times_us.items():
        totals[categorize(name)] += t
    grand = sum(totals.values()) or 1.0
    return {c: 100.0 * totals.get(c, 0.0) / grand for c in CATEGORIES}


def profile(fn: Callable[[], Any], iters: int = 10, warmup: int = 3) -> dict[str, float]:
    """Self CPU time (us per call) of every profiler event while running fn() `iters` times;
    inductor's generated kernels are recorded by name."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch._inductor.config.patch({"cpp.enable_kernel_profile": True}):
        for _ in range(warmup):
            fn()
        with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(iters):
                fn()
    out: dict[str, float] = defaultdict(float)
    for event in prof.key_averages():
        out[event.key] += event.self_cpu_time_total / iters
    return dict(out)
