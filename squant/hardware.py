"""What this CPU can do: ISA features squant's kernels depend on, cores, sockets, NUMA nodes.

Read from /proc/cpuinfo and /sys (Linux); elsewhere the fields come back empty/False.
"""

from __future__ import annotations

import functools
import os
import platform
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# cpuinfo flag -> our name
ISA_FLAGS = {
    "avx2": "avx2",
    "avx512f": "avx512f",
    "avx512_vnni": "avx512_vnni",
    "avx_vnni": "avx_vnni",
    "avx512_bf16": "avx512_bf16",
    "amx_tile": "amx_tile",
    "amx_int8": "amx_int8",
    "amx_bf16": "amx_bf16",
}


@dataclass(frozen=True)
class CpuFeatures:
    model_name: str
    logical_cpus: int
    physical_cores: int
    sockets: int
    numa_nodes: tuple[tuple[int, ...], ...]  # CPUs of each node
    isa: tuple[str, ...]

    def has(self, flag: str) -> bool:
        return flag in self.isa

    @property
    def native_bf16(self) -> bool:
        """BF16 dot products in hardware (AVX512-BF16 or AMX-BF16)."""
        return self.has("avx512_bf16") or self.has("amx_bf16")

    @property
    def int8_path(self) -> str:
        """The int8 GEMM instructions oneDNN will use for u8 x s8."""
        if self.has("amx_int8"):
            return "amx"
        if self.has("avx512_vnni"):
            return "avx512_vnni"
        if self.has("avx_vnni"):
            return "avx_vnni"
        return "no-vnni"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["numa_nodes"] = [list(n) for n in self.numa_nodes]
        d["native_bf16"] = self.native_bf16
        d["int8_path"] = self.int8_path
        return d


def _parse_cpulist(text: str) -> tuple[int, ...]:
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        if "-" in part:
            a, b = part.split("-")
            cpus.extend(range(int(a), int(b) + 1))
        else:
            cpus.append(int(part))
    return tuple(cpus)


@functools.cache
def cpu_features() -> CpuFeatures:
    flags: set[str] = set()
    model = platform.processor() or platform.machine()
    cores: set[tuple[str, str]] = set()
    sockets: set[str] = set()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        physical = core = ""
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            key, value = key.strip(), value.strip()
            if key == "flags" and not flags:
                flags = set(value.split())
            elif key == "model name":
                model = value
            elif key == "physical id":
                physical = value
                sockets.add(value)
            elif key == "core id":
                core = value
                cores.add((physical, core))
    nodes: list[tuple[int, ...]] = []
    node_root = Path("/sys/devices/system/node")
    if node_root.is_dir():
        for d in sorted(node_root.glob("node[0-9]*"), key=lambda p: int(p.name[4:])):
            cpulist = d / "cpulist"
            if cpulist.is_file():
                nodes.append(_parse_cpulist(cpulist.read_text()))
    logical = os.cpu_count() or 1
    if not nodes:
        nodes = [tuple(range(logical))]
    return CpuFeatures(
        model_name=model,
        logical_cpus=logical,
        physical_cores=len(cores) or logical,
        sockets=len(sockets) or 1,
        numa_nodes=tuple(nodes),
        isa=tuple(name for flag, name in ISA_FLAGS.items() if flag in flags),
    )
