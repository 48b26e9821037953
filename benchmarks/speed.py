"""Side-by-side latency of squant and everything a user could run instead (issue: fast, fused,
verified INT8). Random weights with the published configs, identical across runtimes.

    python benchmarks/speed.py --models distilbert-base-uncased --batch 1 --seq 256

Prints ms (median, p90), throughput, the ratio to BF16 compiled and to OpenVINO INT8, and the
cosine of every variant's output vs FP32 eager; writes JSON with config, versions, hardware.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import sys
import time
import traceback
from importlib import metadata
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from competitors import (
    onnxruntime_int8,
    openvino_nncf,
    pt2e_x86,
    pytorch_float,
    torchao_smoothquant,
)

from squant.bench.configs import random_inputs, random_model
from squant.hardware import cpu_features
from squant.outputs import first_tensor
from squant.report import format_table
from squant.timing import measure
from squant.variants import BuildContext, build


def squant_variant(name: str):
    """A variant from squant's registry (squant/variants.py), as deployed."""

    def setup(model, calibration, inputs):
        context = BuildContext(calibration, example_inputs=inputs, progress=False)
        built = build(name, model, context)
        return lambda x: first_tensor(built(**x))

    return setup


VARIANTS = {
    "fp32-eager": pytorch_float.fp32_eager,
    "fp32-compiled": pytorch_float.fp32_compiled,
    "fp32-compiled-frozen": pytorch_float.fp32_compiled_frozen,
    "bf16-compiled": pytorch_float.bf16_compiled,
    "torchao-sq-static": torchao_smoothquant.setup,
    "pt2e-static": pt2e_x86.setup,
    "squant-static": squant_variant("static-compiled"),
    "squant-dynamic": squant_variant("dynamic-compiled"),
    "squant-static-pt2": squant_variant("static-pt2"),
    "openvino-int8": openvino_nncf.setup,
    "openvino-int8-f32": lambda m, c, i: openvino_nncf.setup(m, c, i, precision="f32"),
    "ort-int8-dynamic": onnxruntime_int8.setup,
}
INT8 = {"torchao-sq-static", "pt2e-static", "squant-static", "squant-dynamic", "squant-static-pt2"}
INT8 |= {"openvino-int8", "openvino-int8-f32", "ort-int8-dynamic"}


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in ("torch", "torchao", "transformers", "openvino", "nncf", "onnxruntime"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[pkg] = metadata.version(pkg)
    return out


def run_model(name: str, args, variants: list[str]) -> dict:
    model = random_model(name, seed=0)
    inputs = random_inputs(model, args.batch, args.seq)
    calibration = [random_inputs(model, args.batch, args.seq, seed=100 + i) for i in range(8)]
    with torch.no_grad():
        reference = model(**inputs)[0].float()
    rows = {}
    for v in variants:
        print(f"[{name}] {v} ...", file=sys.stderr, flush=True)
        torch._dynamo.reset()  # each variant compiles afresh (dynamo's cache limit is per code)
        t0 = time.perf_counter()
        try:
            fn = VARIANTS[v](model, calibration, inputs)
            out = fn(inputs)
            setup_s = time.perf_counter() - t0
            cos = float(
                torch.nn.functional.cosine_similarity(out.flatten(), reference.flatten(), 0)
            )
            lat = measure(
                lambda fn=fn: fn(inputs), warmup=3, min_iters=args.iters, min_seconds=args.seconds
            )
        except ImportError as e:
            rows[v] = {"skipped": f"not installed: {e.name or e}"}
            continue
        except Exception as e:  # a failing competitor is a result to report, not a crash
            first = (str(e).strip().splitlines() or [""])[0][:200]
            rows[v] = {"error": f"{type(e).__name__}: {first}"}
            traceback.print_exc(limit=3)
            continue
        rows[v] = {
            **lat.to_dict(),
            "sequences_per_s": 1e3 * args.batch / lat.median_ms,
            "cosine_vs_fp32": cos,
            "setup_s": setup_s,
            "note": getattr(fn, "note", None),
        }
        print(
            f"    {lat.median_ms:.1f} ms, cosine {cos:.5f}, setup {setup_s:.0f}s", file=sys.stderr
        )
    return rows


def print_table(name: str, rows: dict, args) -> None:
    bf16 = rows.get("bf16-compiled", {}).get("median_ms")
    ov = rows.get("openvino-int8", {}).get("median_ms")
    table = []
    for v, r in rows.items():
        if "median_ms" not in r:
            table.append(
                [v, None, None, None, None, None, None, r.get("skipped") or r.get("error")]
            )
            continue
        table.append(
            [
                v,
                f"{r['median_ms']:.1f}",
                f"{r['p90_ms']:.1f}",
                f"{r['sequences_per_s']:.1f}",
                f"{bf16 / r['median_ms']:.2f}x" if bf16 else None,
                f"{ov / r['median_ms']:.2f}x" if ov else None,
                f"{r['cosine_vs_fp32']:.5f}" if v in INT8 or v.startswith("bf16") else None,
                r.get("note") or "",
            ]
        )
    print(f"\n{name} (random weights), batch {args.batch}, seq {args.seq}, {args.threads} threads")
    print(
        format_table(
            [
                "variant",
                "ms p50",
                "ms p90",
                "seq/s",
                "vs bf16",
                "vs OV int8",
                "cos vs fp32",
                "note",
            ],
            table,
        )
    )


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--models", default="distilbert-base-uncased,xlm-roberta-base,bert-large-uncased"
    )
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--json", type=Path, default=Path("results/speed.json"))
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    variants = [v.strip() for v in args.variants.split(",")]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        p.error(f"unknown variants {sorted(unknown)}; choose from {', '.join(VARIANTS)}")
    results = {}
    for name in args.models.split(","):
        results[name] = run_model(name, args, variants)
        print_table(name, results[name], args)
    record = {
        "benchmark": "speed",
        "weights": "random (published configs, seed 0)",
        "batch": args.batch,
        "seq": args.seq,
        "threads": args.threads,
        "versions": versions(),
        "hardware": cpu_features().to_dict(),
        "results": results,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(record, indent=2))
    print(f"\nJSON: {args.json}")


if __name__ == "__main__":
    main()
