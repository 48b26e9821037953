"""`squant analyze`: how far a model can go on this CPU, and how far it went.

Tables (after the paper): measured peaks and balance points (Table 4); every GEMM of the
model with its arithmetic intensity per dtype (Table 5); roofline-bound times and speedup
ceilings (Tables 6-7); realized vs ceiling from a bench JSON (Table 14); and where the time
goes in the compiled model (Table 3).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .bench.peaks import Peaks
from .bench.roofline import (
    DTYPE_BYTES,
    Gemm,
    arithmetic_intensity,
    balance_point,
    encoder_gemms,
    gemm_bytes,
    linear_block_seconds,
    roofline_seconds,
)
from .errors import SquantError
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
    bw = p.bandwidth_bytes_per_s
    t = {d: 1e3 * linear_block_seconds(gemms, d, p.gemm_ops_per_s[d], bw) for d in DTYPE_BYTES}
    return {
        "linear_block_ms_fp32": t["fp32"],
        "linear_block_ms_bf16": t["bf16"],
        "linear_block_ms_int8": t["int8"],
        "int8_vs_fp32_linear": t["fp32"] / t["int8"],
        "int8_vs_bf16_linear": t["bf16"] / t["int8"],
        "int8_vs_fp32_end_to_end": (t["fp32"] + other_ms) / (t["int8"] + other_ms),
        "int8_vs_bf16_end_to_end": (t["bf16"] + other_ms) / (t["int8"] + other_ms),
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
    try:
        record = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise SquantError(f"cannot read bench JSON {path}: {e}") from None
    results = record.get("results", {})
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
