"""Measured hardware ceilings: GEMM throughput per dtype on the kernels squant really uses
(oneDNN FP32 / BF16 linear, oneDNN u8 x s8 qlinear) and STREAM-like memory bandwidth, next to
theoretical peaks derived from the ISA, the clock and the core count."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from ..hardware import CpuFeatures, cpu_features
from ..quant import int8
from ..runtime.timing import measure

# Ops per cycle per core of the widest instruction for each dtype, assuming two 512-bit FMA
# pipes (true of Zen 4/5 and Xeon server cores; an assumption, stated in every report).
OPS_PER_CYCLE = {
    "fp32": {"avx512f": 64, "avx2": 32},  # 2 pipes x 16 lanes x 2 (FMA)
    "bf16": {"amx_bf16": 1024, "avx512_bf16": 128},  # vdpbf16ps: 32 pairs x 2 x 2 pipes
    "int8": {"amx_int8": 2048, "avx512_vnni": 256, "avx_vnni": 128},  # vpdpbusd: 64 MAC x 2 x 2
}


@dataclass(frozen=True)
class Peaks:
    threads: int
    gemm_ops_per_s: dict[str, float]  # measured, per dtype
    bandwidth_bytes_per_s: float  # measured
    theoretical_ops_per_s: dict[str, float | None]
    clock_ghz: float | None
    gemm_shape: tuple[int, int, int]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def clock_ghz() -> float | None:
    """Nominal clock from /proc/cpuinfo (MHz of the first CPU), if readable."""
    info = Path("/proc/cpuinfo")
    if not info.is_file():
        return None
    for line in info.read_text().splitlines():
        if line.startswith("cpu MHz"):
            return float(line.split(":")[1]) / 1000
    return None


def theoretical_peaks(cpu: CpuFeatures, threads: int, ghz: float | None) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for dtype, table in OPS_PER_CYCLE.items():
        per_cycle = next((ops for isa, ops in table.items() if cpu.has(isa)), None)
        out[dtype] = per_cycle * ghz * 1e9 * threads if per_cycle and ghz else None
    return out


def measure_gemm(dtype: str, m: int, k: int, n: int, seconds: float = 1.0) -> float:
    """Sustained ops/s of the GEMM kernel squant uses for dtype at [m, k] x [k, n]."""
    g = torch.Generator().manual_seed(0)
    if dtype == "int8":
        w_q = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g)
        packed = int8.pack_weight(w_q)
        x_q = torch.randint(0, 256, (m, k), dtype=torch.uint8, generator=g)
        scale, zp = torch.full((n,), 0.01), torch.zeros(n, dtype=torch.int32)
        fn = lambda: int8.int8_linear(x_q, 0.01, 128, packed, scale, zp, None, torch.float32)  # noqa: E731
    else:
        dt = torch.float32 if dtype == "fp32" else torch.bfloat16
        x = torch.randn(m, k, generator=g).to(dt)
        w = torch.randn(n, k, generator=g).to(dt)
        if dt == torch.bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
            # oneDNN has no BF16 linear on this CPU (no AVX512-BW/VL/DQ, no AVX-NE-CONVERT):
            # BF16 runs ATen's fallback here, which is what a BF16 model would get
            fn = lambda: torch.nn.functional.linear(x, w)  # noqa: E731
        else:
            packed = torch.ops.mkldnn._reorder_linear_weight(w, m)
            fn = lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")  # noqa: E731
    with torch.no_grad():
        t = measure(fn, warmup=3, min_seconds=seconds).median_ms / 1e3
    return 2 * m * k * n / t


def measure_bandwidth(megabytes: int = 512, seconds: float = 1.0) -> float:
    """STREAM-like copy bandwidth (bytes read + written per second) on arrays far above cache."""
    n = megabytes * 2**20 // 4
    a = torch.ones(n)
    b = torch.empty(n)
    t = measure(lambda: b.copy_(a), warmup=2, min_seconds=seconds).median_ms / 1e3
    return 2 * a.numel() * 4 / t


def measure_peaks(
    threads: int | None = None,
    shape: tuple[int, int, int] = (1024, 4096, 4096),
    seconds: float = 1.0,
) -> Peaks:
    threads = threads or torch.get_num_threads()
    cpu = cpu_features()
    ghz = clock_ghz()
    gemm = {d: measure_gemm(d, *shape, seconds=seconds) for d in ("fp32", "bf16", "int8")}
    return Peaks(
        threads=threads,
        gemm_ops_per_s=gemm,
        bandwidth_bytes_per_s=measure_bandwidth(seconds=seconds),
        theoretical_ops_per_s=theoretical_peaks(cpu, threads, ghz),
        clock_ghz=ghz,
        gemm_shape=shape,
    )
