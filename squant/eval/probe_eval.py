"""Linear-probe accuracy of an encoder and its variants on an NLI pair task (e.g. SNLI).

    evaluate_probe("all-MiniLM-L6-v2/", test="snli_1.0_test.jsonl",
                   train="snli_1.0_train_subset.jsonl", variants=("fp32", "static"))

The probe is fit once on FP32 features of the first `train_pairs` training pairs and reused
for every variant; calibration sentences come from the *end* of the training file, apart
from the probe's pairs and never from the test set.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..cache import cache_root
from ..checkpoint.models import load_model, load_tokenizer
from ..data import tokenize
from ..errors import SquantError
from ..quant.mappings import max_positions
from .nli import NLI_LABELS, Pairs, read_nli
from .probe import (
    LinearProbe,
    accuracy,
    cosine_tail,
    embed,
    mean_cosine,
    pair_features,
    paired_accuracy_delta,
)
from .task import Task, score_variants


@dataclass(frozen=True)
class ProbeSettings:
    train_pairs: int = 20_000
    l2: float = 1e-2
    calib_sentences: int = 512
    max_length: int = 128
    batch_size: int = 128


def _cache_key(*parts: Any) -> str:
    h = hashlib.sha1()
    for p in parts:
        if isinstance(p, Path) and p.exists():
            for f in sorted(p.iterdir()) if p.is_dir() else [p]:
                st = f.stat()
                h.update(f"{f.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode())
        else:
            h.update(repr(p).encode())
    return h.hexdigest()[:16]


def _pair_embeddings(
    model: Any, tok: Any, pairs: Pairs, s: ProbeSettings, desc: str, progress: bool
) -> tuple[Tensor, Tensor]:
    texts = pairs.premises + pairs.hypotheses
    emb = embed(model, tok, texts, s.batch_size, s.max_length, desc=desc, progress=progress)
    return emb[: len(pairs)], emb[len(pairs) :]


def prepare_probe(
    model_dir: str | Path,
    test: str | Path,
    train: str | Path,
    limit: int | None = None,
    settings: ProbeSettings | None = None,
    cache_dir: Path | None = None,
    progress: bool = True,
) -> Task:
    """The probe as a Task: fit once on FP32 features, then score any encoder variant by
    probe accuracy and mean embedding cosine vs FP32 on the test pairs."""
    s = settings or ProbeSettings()
    model = load_model(model_dir, task="base")
    tok = load_tokenizer(model_dir)
    test_pairs = read_nli(test, limit)
    train_all = read_nli(train)
    n_calib_pairs = (s.calib_sentences + 1) // 2
    if len(train_all) < s.train_pairs + n_calib_pairs:
        raise SquantError(
            f"{train} has {len(train_all)} labelled pairs; the probe needs {s.train_pairs} plus "
            f"{n_calib_pairs} held apart for calibration"
        )
    probe_pairs = train_all.slice(0, s.train_pairs)
    held = train_all.slice(len(train_all) - n_calib_pairs)
    calib_texts = [t for pair in zip(held.premises, held.hypotheses, strict=True) for t in pair]
    calibration = tokenize(
        tok, calib_texts[: s.calib_sentences], 32, s.max_length, max_positions(model)
    )

    cache = (cache_dir or cache_root()) / "probe"
    key = _cache_key(Path(model_dir), Path(train), s.train_pairs, s.max_length, "v1")
    cached = cache / f"train-features-{key}.pt"
    if cached.is_file():
        feats = torch.load(cached, weights_only=True)
    else:
        u, v = _pair_embeddings(model, tok, probe_pairs, s, "probe features (fp32)", progress)
        feats = pair_features(u, v)
        cache.mkdir(parents=True, exist_ok=True)
        torch.save(feats, cached)
    y_train = torch.tensor(probe_pairs.labels)
    probe = LinearProbe.fit(feats, y_train, len(NLI_LABELS), l2=s.l2)
    gold = torch.tensor(test_pairs.labels)
    reference: dict[str, Tensor] = {}

    def score(variant: Any, label: str) -> dict[str, float]:
        t0 = time.perf_counter()
        u, v = _pair_embeddings(variant, tok, test_pairs, s, f"test ({label})", progress)
        seconds = time.perf_counter() - t0
        emb = torch.cat([u, v])
        if "fp32" not in reference:  # the FP32 embeddings are the cosine reference
            ref = (
                emb
                if variant is model
                else torch.cat(_pair_embeddings(model, tok, test_pairs, s, "test (fp32)", progress))
            )
            reference["fp32"] = ref
            n = len(test_pairs)
            reference["labels"] = probe.predict(pair_features(ref[:n], ref[n:]))
        predicted = probe.predict(pair_features(u, v))
        return {
            "accuracy": accuracy(predicted, gold),
            # the share of pairs labelled as FP32 labels them: fidelity without the noise of
            # which near-boundary pairs happen to flip towards or away from the gold label
            "agreement": accuracy(predicted, reference["labels"]),
            # accuracy minus FP32's on the same pairs, and whether that is more than noise
            **paired_accuracy_delta(predicted, reference["labels"], gold),
            "embedding_cosine": mean_cosine(emb, reference["fp32"]),
            **cosine_tail(emb, reference["fp32"]),
            "sentences_per_second": 2 * len(test_pairs) / seconds,
        }

    info = {"probe": {**asdict(s), "train_accuracy": accuracy(probe.predict(feats), y_train)}}
    return Task(
        "probe",
        model,
        calibration,
        ("accuracy", "agreement", "embedding_cosine", "cosine_min", "cosine_p1"),
        len(test_pairs),
        score,
        info,
        batch_size=s.batch_size,
        max_length=s.max_length,
    )


def evaluate_probe(
    model_dir: str | Path,
    test: str | Path,
    train: str | Path,
    variants: tuple[str, ...] | str = ("fp32", "static", "dynamic"),
    alpha: float | str = "auto",
    limit: int | None = None,
    settings: ProbeSettings | None = None,
    cache_dir: Path | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Accuracy (percent) and embedding cosine vs FP32 per variant, plus timing."""
    task = prepare_probe(model_dir, test, train, limit, settings, cache_dir, progress)
    results = score_variants(task, variants, alpha, progress)
    return {
        "task": "probe",
        "model": str(model_dir),
        "test": str(test),
        "n_test": task.n_scored,
        "alpha": alpha,
        **task.info,
        "results": results,
    }
