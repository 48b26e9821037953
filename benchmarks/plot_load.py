"""Latency against served load for several `benchmarks/load.py` open-loop runs, on one plot.

    python benchmarks/plot_load.py a.json b.json --out latency_vs_load.png

Each JSON is a load.py --json record (its label names the curve): p50 dashed, p99 solid,
against the requests/s actually served at each offered rate.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", help="load.py --json records")
    p.add_argument("--out", required=True, help="the PNG to write")
    p.add_argument("--title", default="latency vs load")
    args = p.parse_args()

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for path in args.runs:
        record = json.loads(Path(path).read_text())
        rows = [r for r in record["results"] if r.get("p99_ms") is not None]
        served = [r["throughput_rps"] for r in rows]
        (line,) = ax.plot(served, [r["p99_ms"] for r in rows], "o-", label=f"{record['label']} p99")
        ax.plot(
            served,
            [r["p50_ms"] for r in rows],
            "s--",
            color=line.get_color(),
            label=f"{record['label']} p50",
        )
    ax.set_xlabel("served requests/s")
    ax.set_ylabel("latency ms (log)")
    ax.set_yscale("log")
    ax.set_title(args.title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
