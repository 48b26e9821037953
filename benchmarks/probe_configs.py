"""The SNLI linear probe of the real all-MiniLM-L6-v2 for several SmoothQuantConfigs side by
side (one process, one probe, one FP32 reference): accuracy, agreement with FP32's labels,
accuracy minus FP32's on the same pairs with its 95% interval, and embedding cosine (mean,
worst pair). Today's defaults against each mode without float outlier channels and with the
alpha search up to 1 (the earlier defaults), and dynamic with static's alpha search
and outlier site (its defaults before they became per mode).

    python benchmarks/probe_configs.py [--snli-dir .cache/snli] [--test-pairs all]
        [--test-file PAIRS.jsonl]   # a second held-out set, e.g. training pairs the probe
                                    # never saw, to tell a real accuracy change from noise
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import squant
from squant.bench.report import format_table
from squant.eval.probe_eval import ProbeSettings, prepare_probe

CONFIGS = {
    "static (defaults)": squant.SmoothQuantConfig(mode="static"),
    "static, no outlier channels, alpha<=1": squant.SmoothQuantConfig(
        mode="static", outlier_channels=0, alpha_max=1.0
    ),
    "dynamic (defaults)": squant.SmoothQuantConfig(mode="dynamic"),
    "dynamic, alpha auto<=0.5, outliers at ffn_out": squant.SmoothQuantConfig(
        mode="dynamic", alpha="auto", outlier_sites=("ffn_out",)
    ),
    "dynamic, no outlier channels, alpha<=1": squant.SmoothQuantConfig(
        mode="dynamic", alpha="auto", outlier_channels=0, alpha_max=1.0
    ),
}


def main() -> None:
    from demo import minilm_dir  # benchmarks/demo.py

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--snli-dir", type=Path, default=Path(".cache/snli"))
    p.add_argument("--test-pairs", default="all")
    p.add_argument("--test-file", type=Path, default=None, help="default: SNLI 1.0 test")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    limit = None if args.test_pairs == "all" else int(args.test_pairs)
    task = prepare_probe(
        minilm_dir(),
        args.test_file or args.snli_dir / "snli_1.0_test.jsonl",
        args.snli_dir / "snli_1.0_train_subset.jsonl",
        limit,
        ProbeSettings(),
    )
    results = {"fp32": task.score(task.model, "fp32")}
    for name, config in CONFIGS.items():
        q = squant.quantize(task.model, config, task.calibration, progress=False)
        with torch.no_grad():
            results[name] = task.score(q, name)
    fp32 = results["fp32"]["accuracy"]
    rows = [
        [
            name,
            f"{r['accuracy']:.2f}",
            f"{r['accuracy'] - fp32:+.2f} ± {r['accuracy_delta_ci95']:.2f}",
            f"{r['agreement']:.2f}",
            f"{r['embedding_cosine']:.5f}",
            f"{r['cosine_min']:.4f}",
        ]
        for name, r in results.items()
    ]
    test = args.test_file or "SNLI 1.0 test"
    print(f"all-MiniLM-L6-v2, {test}, {task.n_scored} pairs, linear probe on FP32 features")
    headers = ["variant", "accuracy %", "vs fp32 (95% CI)", "agrees w/ fp32 %", "cosine", "worst"]
    print(format_table(headers, rows))
    if args.json:
        configs = {n: c.to_dict() for n, c in CONFIGS.items()}
        record = {
            "test": str(test),
            "n_test": task.n_scored,
            "configs": configs,
            "results": results,
        }
        args.json.write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
