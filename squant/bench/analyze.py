"""`squant analyze`: how far a model can go on this CPU, and how far it went.

Tables (after the paper): measured peaks and balance points (Table 4); every GEMM of the
model with its arithmetic intensity per dtype (Table 5); roofline-bound times and speedup
ceilings (Tables 6-7); realized vs ceiling from a bench JSON (Table 14); and where the time
goes in the compiled model (Table 3).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import SquantError
from ..files import read_json
from ..hardware import CpuFeatures, cpu_features
from ..quant.mappings import hf_config
from .peaks import Peaks, measure_peaks
from .report import format_table
from .roofline import (
    DTYPE_BYTES,
    Gemm,
    arithmetic_intensity,
    balance_point,
    encoder_gemms,
    gemm_bytes,
    linear_block_seconds,
    roofline_seconds,
    speedup_ceiling,
)
from .variants import GEMM_DTYPES


def gemm_dtype(variant: str) -> str | None:
    """The dtype a bench variant's GEMMs run in (squant's names, benchmarks/speed.py's
    "squant-" and "-eager"/"-frozen" spellings), None for other runtimes."""
    return GEMM_DTYPES.get(variant.removeprefix("squant-").split("-")[0])


def model_dims(config: Any) -> dict[str, int]:
    """hidden, intermediate, heads and layers of a BERT-family config (DistilBERT names too)."""

    def get(*names: str) -> Any:
        return next(getattr(config, n) for n in names if hasattr(config, n))

    return {
        "hidden": int(get("hidden_size", "dim")),
        "intermediate": int(get("intermediate_size", "hidden_dim")),
        "heads": int(get("num_attention_heads", "n_heads")),
        "layers": int(get("num_hidden_layers", "n_layers")),
    }


def peaks_table(p: Peaks) -> list[list[Any]]:
    rows = []
    for dtype in DTYPE_BYTES:
        measured = p.gemm_ops_per_s[dtype]
        theo = p.theoretical_ops_per_s.get(dtype)
        rows.append(
            [
                dtype,
                f"{measured / 1e9:.0f}",
                f"{theo / 1e9:.0f}" if theo else None,
                f"{100 * measured / theo:.0f}%" if theo else None,
                f"{balance_point(measured, p.bandwidth_bytes_per_s):.1f}",
            ]
        )
    return rows


def gemm_table(gemms: list[Gemm]) -> list[list[Any]]:
    return [
        [
            g.name,
            f"{g.m}x{g.k}x{g.n}",
            g.count,
            *(f"{arithmetic_intensity(g.m, g.k, g.n, d):.2f}" for d in DTYPE_BYTES),
        ]
        for g in gemms
    ]


def roofline_table(gemms: list[Gemm], p: Peaks) -> list[list[Any]]:
    """Per weight GEMM: roofline-bound ms per forward (all its repetitions) per dtype."""
    bw = p.bandwidth_bytes_per_s
    rows = []
    for g in gemms:
        if not g.weights:
            continue
        ms = {
            d: 1e3
            * g.count
            * roofline_seconds(g.flops, gemm_bytes(g.m, g.k, g.n, d), p.gemm_ops_per_s[d], bw)
            for d in DTYPE_BYTES
        }
        rows.append(
            [
                g.name,
                *(f"{ms[d]:.2f}" for d in DTYPE_BYTES),
                f"{ms['fp32'] / ms['int8']:.2f}x",
                f"{ms['bf16'] / ms['int8']:.2f}x",
            ]
        )
    return rows


def ceilings(gemms: list[Gemm], p: Peaks, other_ms: float = 0.0) -> dict[str, float]:
    """Speedup ceilings of INT8 over FP32 and BF16: linear block only, and end to end with
    `other_ms` of work that does not change with the GEMM dtype (attention, norms, ...)."""
    bw, ops = p.bandwidth_bytes_per_s, p.gemm_ops_per_s
    t = {d: 1e3 * linear_block_seconds(gemms, d, ops[d], bw) for d in DTYPE_BYTES}
    other_s = other_ms / 1e3
    return {
        "linear_block_ms_fp32": t["fp32"],
        "linear_block_ms_bf16": t["bf16"],
        "linear_block_ms_int8": t["int8"],
        "int8_vs_fp32_linear": speedup_ceiling(gemms, ops, bw, "int8", "fp32"),
        "int8_vs_bf16_linear": speedup_ceiling(gemms, ops, bw, "int8", "bf16"),
        "int8_vs_fp32_end_to_end": speedup_ceiling(gemms, ops, bw, "int8", "fp32", other_s),
        "int8_vs_bf16_end_to_end": speedup_ceiling(gemms, ops, bw, "int8", "bf16", other_s),
    }


def realized_vs_ceiling(bench: dict[str, Any], gemms: list[Gemm], p: Peaks) -> list[list[Any]]:
    """Table 14: each variant's measured ms against the roofline bound of its linear block."""
    rows = []
    for name, r in bench.items():
        dtype = gemm_dtype(name)
        ms = r.get("median_ms") if isinstance(r, dict) else None
        if dtype is None or ms is None:
            continue
        bound = 1e3 * linear_block_seconds(
            gemms, dtype, p.gemm_ops_per_s[dtype], p.bandwidth_bytes_per_s
        )
        rows.append([name, dtype, f"{ms:.1f}", f"{bound:.1f}", f"{100 * bound / ms:.0f}%"])
    return rows


def read_bench(path: str | Path, model: str | None = None) -> dict[str, Any]:
    """Variant -> timing dict from a `squant bench` or benchmarks/speed.py JSON."""
    path = Path(path)
    record = read_json(path, "a bench JSON")
    results = record.get("results", {}) if isinstance(record, dict) else None
    if not isinstance(results, dict):
        raise SquantError(f"{path} is not a bench JSON (no results object)")
    if results and all(isinstance(v, dict) and "median_ms" not in v for v in results.values()):
        # benchmarks/speed.py: results per model
        if model is None or model not in results:
            if len(results) != 1:
                raise SquantError(f"{path} holds several models ({', '.join(results)}); name one")
            model = next(iter(results))
        results = results[model]
    return {k: v for k, v in results.items() if isinstance(v, dict)}


def model_gemms(config: Any, batch: int, seq: int) -> list[Gemm]:
    d = model_dims(config)
    return encoder_gemms(batch, seq, d["hidden"], d["intermediate"], d["heads"], d["layers"])


@dataclass
class Analysis:
    """Everything `squant analyze` measured and derived for one model and shape."""

    model: str
    batch: int
    seq: int
    hardware: CpuFeatures
    peaks: Peaks
    gemms: list[Gemm]
    hotspots: dict[str, dict[str, Any]]  # precision -> {"percent": {...}, "ms": ...}
    other_ms: float  # non-GEMM ms of the INT8 forward (from the hotspots), 0 without them
    ceilings: dict[str, float]
    realized: list[list[Any]] | None  # realized vs ceiling rows, when a bench JSON was given

    def record(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "model": self.model,
            "batch": self.batch,
            "seq": self.seq,
            "hardware": self.hardware.to_dict(),
            "peaks": self.peaks.to_dict(),
            "ceilings": self.ceilings,
        }
        if self.hotspots:
            out["hotspots"] = self.hotspots
        if self.realized is not None:
            out["realized_vs_ceiling"] = self.realized
        return out

    def lines(self) -> list[str]:
        cpu, p, c = self.hardware, self.peaks, self.ceilings
        out = [
            f"{cpu.model_name}: {cpu.physical_cores} cores, {len(cpu.numa_nodes)} NUMA node(s), "
            f"ISA {' '.join(cpu.isa)}; {p.threads} threads, clock {p.clock_ghz} GHz",
            f"memory bandwidth (copy): {p.bandwidth_bytes_per_s / 1e9:.1f} GB/s",
            "",
            format_table(
                ["dtype", "measured GOP/s", "theoretical", "of peak", "balance ops/B"],
                peaks_table(p),
            ),
            "",
            f"GEMMs of one forward, batch {self.batch}, seq {self.seq} "
            "(arithmetic intensity, ops/byte)",
            format_table(
                ["GEMM", "m x k x n", "count", "fp32", "bf16", "int8"], gemm_table(self.gemms)
            ),
            "",
            "roofline-bound ms per forward (linear block)",
            format_table(
                ["GEMM", "fp32", "bf16", "int8", "int8 vs fp32", "int8 vs bf16"],
                roofline_table(self.gemms, p),
            ),
        ]
        if self.hotspots:
            kinds = ("linear", "attention", "layernorm", "other")
            rows = [
                [v, *(f"{h['percent'][k]:.1f}%" for k in kinds), f"{h['ms']:.1f}"]
                for v, h in self.hotspots.items()
            ]
            out += [
                "",
                "where the time goes (profiler, compiled model)",
                format_table(["variant", *kinds, "ms"], rows),
            ]
        out += [
            "",
            f"ceilings: INT8 linear block {c['int8_vs_fp32_linear']:.2f}x FP32, "
            f"{c['int8_vs_bf16_linear']:.2f}x BF16; end to end with {self.other_ms:.1f} ms of "
            f"non-GEMM work {c['int8_vs_fp32_end_to_end']:.2f}x FP32, "
            f"{c['int8_vs_bf16_end_to_end']:.2f}x BF16",
        ]
        if self.realized is not None:
            out += [
                "",
                "realized vs ceiling (linear-block roofline bound / measured forward)",
                format_table(
                    ["variant", "GEMM dtype", "measured ms", "bound ms", "of ceiling"],
                    self.realized,
                ),
            ]
        return out


def analyze_model(
    model: Any,
    name: str,
    batch: int = 1,
    seq: int = 256,
    hotspots: Sequence[str] = ("fp32", "static"),
    bench: str | Path | None = None,
    quick: bool = False,
) -> Analysis:
    """Measure this CPU's ceilings, place the model's GEMMs on the roofline, profile where the
    compiled variants spend their time, and (with a bench JSON) how close they came.
    quick: ceilings from a small GEMM for 0.1 s each (a rough look in seconds)."""
    gemms = model_gemms(hf_config(model), batch, seq)
    peaks = measure_peaks(shape=(256, 1024, 1024), seconds=0.1) if quick else measure_peaks()
    hot = profile_variants(model, hotspots, batch, seq) if hotspots else {}
    int8 = [h for v, h in hot.items() if v in ("static", "dynamic")]
    other_ms = int8[0]["ms"] * (100 - int8[0]["percent"]["linear"]) / 100 if int8 else 0.0
    realized = (
        realized_vs_ceiling(read_bench(bench, name), gemms, peaks) if bench is not None else None
    )
    return Analysis(
        name,
        batch,
        seq,
        cpu_features(),
        peaks,
        gemms,
        hot,
        other_ms,
        ceilings(gemms, peaks, other_ms),
        realized,
    )


def profile_variants(
    model: Any, precisions: Sequence[str], batch: int, seq: int
) -> dict[str, dict[str, Any]]:
    """Per precision, the compiled model's time split (profiler) and its median ms, on random
    tokens (enough to place the time; accuracy is not measured here)."""
    import torch

    from ..runtime.timing import measure
    from .configs import random_calibration, random_inputs
    from .hotspots import breakdown, profile
    from .variants import BuildContext, Variant, build, parse_variants

    inputs = random_inputs(model, batch, seq)
    context = BuildContext(
        random_calibration(model, seq=min(seq, 128)),
        example_inputs=inputs,
        kernel_profile=True,
        progress=False,
    )
    out = {}
    for v in parse_variants(tuple(precisions)):
        if v.runtime == "pt2":
            raise SquantError(f"--hotspots profiles compiled models; {v.name} is a package")
        v = Variant(v.precision, "compiled")  # a bare precision means its compiled model
        torch._dynamo.reset()
        run = functools.partial(build(v, model, context), **inputs)
        out[v.precision] = {
            "percent": breakdown(profile(run)),
            "ms": measure(run, min_seconds=1.0).median_ms,
        }
    return out
