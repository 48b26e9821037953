"""Roofline math as small pure functions (the paper's Tables 4-7 and 14).

Byte-counting convention (the paper's, which reproduces its Table 5): a GEMM reads its two
inputs once in the compute dtype and writes its M x N output once in FP32 (4 bytes), e.g.
256 x 1024 x 1024 has arithmetic intensity 85.33 (FP32), 146.29 (BF16), 227.56 (INT8) ops/byte.
"""

from __future__ import annotations

from dataclasses import dataclass

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "int8": 1}
OUTPUT_BYTES = 4


@dataclass(frozen=True)
class Gemm:
    """One GEMM shape [m, k] x [k, n] and how many times it runs per forward."""

    name: str
    m: int
    k: int
    n: int
    count: int = 1
    weights: bool = True  # False for activation x activation (attention) GEMMs

    @property
    def flops(self) -> int:
        return gemm_flops(self.m, self.k, self.n)


def gemm_flops(m: int, k: int, n: int) -> int:
    return 2 * m * k * n


def gemm_bytes(m: int, k: int, n: int, dtype: str) -> int:
    size = DTYPE_BYTES[dtype]
    return (m * k + k * n) * size + m * n * OUTPUT_BYTES


def arithmetic_intensity(m: int, k: int, n: int, dtype: str) -> float:
    """Operations per byte moved."""
    return gemm_flops(m, k, n) / gemm_bytes(m, k, n, dtype)


def balance_point(peak_ops_per_s: float, bandwidth_bytes_per_s: float) -> float:
    """The arithmetic intensity above which a kernel is compute bound (ops/byte)."""
    return peak_ops_per_s / bandwidth_bytes_per_s


def roofline_seconds(flops: float, nbytes: float, peak_ops_per_s: float, bandwidth: float) -> float:
    """Lower bound on the time of a kernel: whichever of compute and memory takes longer."""
    return max(flops / peak_ops_per_s, nbytes / bandwidth)


def attainable(ai: float, peak_ops_per_s: float, bandwidth: float) -> float:
    """Attainable ops/s at arithmetic intensity `ai`."""
    return min(peak_ops_per_s, ai * bandwidth)


def encoder_gemms(
    batch: int, seq: int, hidden: int, intermediate: int, heads: int, layers: int
) -> list[Gemm]:
    """Every GEMM of one forward of a BERT-style encoder (Q, K, V counted separately, as
    in the paper; squant fuses them into one GEMM of 3x the width)."""
    t = batch * seq
    d = hidden // heads
    return [
        Gemm("Q/K/V projection", t, hidden, hidden, 3 * layers),
        Gemm("attention output", t, hidden, hidden, layers),
        Gemm("FFN in", t, hidden, intermediate, layers),
        Gemm("FFN out", t, intermediate, hidden, layers),
        Gemm("attention scores QK^T", seq, d, seq, batch * heads * layers, weights=False),
        Gemm("attention context PV", seq, seq, d, batch * heads * layers, weights=False),
    ]


def linear_block_seconds(
    gemms: list[Gemm], dtype: str, peak_ops_per_s: float, bandwidth: float
) -> float:
    """Roofline-bound time of the weight GEMMs (the linear block) per forward."""
    return sum(
        g.count
        * roofline_seconds(g.flops, gemm_bytes(g.m, g.k, g.n, dtype), peak_ops_per_s, bandwidth)
        for g in gemms
        if g.weights
    )


def speedup_ceiling(
    gemms: list[Gemm],
    peaks: dict[str, float],
    bandwidth: float,
    fast: str,
    slow: str,
    other_seconds: float = 0.0,
) -> float:
    """Ceiling of time(slow)/time(fast) for the linear block, plus a fixed time for the parts
    no dtype change speeds up (Amdahl: other_seconds=0 gives the linear-block ceiling)."""
    t_slow = linear_block_seconds(gemms, slow, peaks[slow], bandwidth) + other_seconds
    t_fast = linear_block_seconds(gemms, fast, peaks[fast], bandwidth) + other_seconds
    return t_slow / t_fast
