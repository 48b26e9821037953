"""PNG charts (matplotlib is the optional `plot` extra; without it, charts are skipped)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .peaks import Peaks
from .roofline import DTYPE_BYTES, Gemm, arithmetic_intensity, attainable


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def roofline_png(gemms: list[Gemm], peaks: Peaks, path: str | Path, title: str) -> Path:
    """Measured roofs per dtype, and every GEMM of the model as a point on each."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    bw = peaks.bandwidth_bytes_per_s
    colors = {"fp32": "tab:blue", "bf16": "tab:orange", "int8": "tab:green"}
    xs = [2**i for i in range(-2, 12)]
    for dtype in DTYPE_BYTES:
        peak = peaks.gemm_ops_per_s[dtype]
        ax.plot(
            xs,
            [attainable(x, peak, bw) / 1e9 for x in xs],
            color=colors[dtype],
            label=f"{dtype} roof",
        )
        for g in gemms:
            ai = arithmetic_intensity(g.m, g.k, g.n, dtype)
            y = attainable(ai, peak, bw) / 1e9
            ax.scatter([ai], [y], color=colors[dtype], s=18, zorder=3)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (ops/byte)")
    ax.set_ylabel("attainable GOP/s")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    path = Path(path)
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")  # the path as given (no ".png" added)
    plt.close(fig)
    return path


def bars_png(values: dict[str, float], path: str | Path, title: str, ylabel: str) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    names = list(values)
    ax.bar(names, [values[n] for n in names], color="tab:green")
    for i, n in enumerate(names):
        ax.text(i, values[n], f"{values[n]:.1f}", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    plt.setp(ax.get_xticklabels(), rotation=20, ha="right")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110, format="png")  # the path as given (no ".png" added)
    plt.close(fig)
    return path
