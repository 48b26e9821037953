"""A quantized directory's cached package (what `squant serve` runs) against the model
compiled at start-up (what it ran before), in one process.

    python benchmarks/package_vs_compiled.py QUANTIZED_DIR [--rounds 7] [--json out.json]

Both are built first (the package through engine/package_cache.py, so a second run loads it
from the cache; squant.compile with dynamic shapes and the C++ wrapper, as the compiled
runtime does), then timed at serving shapes in interleaved rounds at one thread; then the
package is called from one and from two threads at once (one core each) to show that its calls
run concurrently. Prints a table and writes JSON with the command, commit, host ISA and
versions.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import squant
from squant.bench.report import format_table
from squant.checkpoint.models import load_tokenizer
from squant.checkpoint.sentence_transformer import inner_model, is_sentence_transformer
from squant.engine.runtime import compiled_runner, packaged_model
from squant.provenance import provenance
from squant.runtime.compiler import agreement
from squant.runtime.outputs import first_tensor

SHAPES = ((1, 16), (1, 128), (8, 32), (16, 128), (32, 16))


def calls_per_s(fn, threads: int, seconds: float = 3.0) -> float:
    counts: list[int] = []
    start = threading.Barrier(threads + 1)

    def loop() -> None:
        torch.set_num_threads(1)
        fn()  # warm this thread
        start.wait()
        n, end = 0, time.perf_counter() + seconds
        while time.perf_counter() < end:
            fn()
            n += 1
        counts.append(n)

    workers = [threading.Thread(target=loop) for _ in range(threads)]
    for w in workers:
        w.start()
    start.wait()
    for w in workers:
        w.join()
    return sum(counts) / seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", help="a directory from squant quantize / squant.save")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--json", default=None)
    args = p.parse_args()

    loaded = squant.load(args.model)
    model = inner_model(loaded) if is_sentence_transformer(loaded) else loaded
    tok = load_tokenizer(args.model)
    t0 = time.perf_counter()
    package = packaged_model(Path(args.model), model, tok, 1, 2, required=True)
    package_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    built = compiled_runner(model, tok, 1, required=True)
    compile_s = time.perf_counter() - t0
    assert package is not None and built is not None
    compiled = built[1]
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    vocab = int(model.config.vocab_size)
    inputs = {}
    for b, s in SHAPES:
        ids = torch.randint(1000, vocab, (b, s), generator=gen)
        inputs[(b, s)] = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    runners = {"package": package, "compiled": compiled}
    times: dict[tuple[int, int], dict[str, list[float]]] = {
        s: {k: [] for k in runners} for s in SHAPES
    }
    with torch.no_grad():
        for shape in SHAPES:
            for fn in runners.values():
                fn(**inputs[shape])
        for r in range(args.rounds):
            order = list(runners.items())[:: 1 if r % 2 == 0 else -1]
            for shape in SHAPES:
                for name, fn in order:
                    t = time.perf_counter()
                    for _ in range(3):
                        fn(**inputs[shape])
                    times[shape][name].append((time.perf_counter() - t) / 3 * 1000)
        rows, results = [], []
        for shape in SHAPES:
            t = times[shape]
            ratio = statistics.median(
                c / q for c, q in zip(t["compiled"], t["package"], strict=True)
            )
            cos = agreement(
                first_tensor(compiled(**inputs[shape])),
                first_tensor(package(**inputs[shape])),
                None,
            )
            entry = {
                "batch": shape[0],
                "seq": shape[1],
                "package_ms": statistics.median(t["package"]),
                "compiled_ms": statistics.median(t["compiled"]),
                "compiled_over_package": ratio,
                "cosine": cos,
            }
            results.append(entry)
            rows.append(
                [
                    f"{shape[0]} x {shape[1]}",
                    f"{entry['package_ms']:.2f}",
                    f"{entry['compiled_ms']:.2f}",
                    f"{ratio:.3f}x",
                    f"{cos:.6f}",
                ]
            )
        one = inputs[(8, 32)]
        rates = {n: calls_per_s(lambda: package(**one), n) for n in (1, 2)}
    print(
        format_table(
            ["batch x seq", "package ms", "compiled ms", "compiled/package", "cosine"], rows
        )
    )
    print(
        f"package from 1 / 2 threads at 8 x 32: {rates[1]:.1f} / {rates[2]:.1f} calls/s "
        f"({rates[2] / rates[1]:.2f}x); build: package {package_s:.0f} s, compile {compile_s:.0f} s"
    )
    out = {
        "provenance": provenance(),
        "threads": 1,
        "rounds": args.rounds,
        "shapes": results,
        "package_calls_per_s": {"1_thread": rates[1], "2_threads": rates[2]},
        "package_s": package_s,
        "compile_s": compile_s,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
