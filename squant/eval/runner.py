"""`squant eval`: score FP32 / BF16 / INT8 variants of a checkpoint on a task, in one call.

    evaluate("ckpt/", task="squad", data="dev-v1.1.json", variants="fp32,static,dynamic")

Calibration never uses scored examples: it comes from --calib when given, otherwise from a
held-apart slice at the end of the data file (those examples are then not scored).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

from ..bench.variants import parse_variants
from ..checkpoint.models import load_model, load_tokenizer
from ..data import Text, read_texts, tokenize
from ..errors import SquantError
from ..quant.mappings import max_positions
from . import classify, squad
from .metrics import accuracy, relative_loss, squad_scores
from .probe_eval import ProbeSettings, prepare_probe
from .task import Task, score_variants

T = TypeVar("T")
PathLike = str | Path


@dataclass(frozen=True)
class EvalSettings:
    batch_size: int = 16
    max_length: int = 384  # squad window; classification uses min(this, 128)
    doc_stride: int = 128
    calib_size: int = 128
    progress: bool = True


def _calibration(
    tok: Any, texts: Sequence[Text], max_length: int, model: Any
) -> list[dict[str, Any]]:
    # with coverage inputs (empty, 1-5 words, packed documents up to the model's limit)
    return tokenize(tok, texts, 8, max_length, coverage_length=max_positions(model))


def _hold_apart(
    items: list[T], calib_size: int, has_calib_file: bool, limit: int | None
) -> tuple[list[T], list[T]]:
    """(scored, held): the last calib_size items are held apart for calibration (none when a
    calibration file is given) and never scored; limit caps the scored ones."""
    held = 0 if has_calib_file else calib_size
    if held and len(items) <= held:
        raise SquantError(
            f"the data has {len(items)} examples: too few to hold {calib_size} apart for "
            "calibration; pass --calib FILE or lower --calib-size"
        )
    scored, rest = items[: len(items) - held], items[len(items) - held :]
    return (scored[:limit] if limit else scored), rest


def squad_task(
    model_dir: PathLike, data: PathLike, limit: int | None, calib: PathLike | None, s: EvalSettings
) -> Task:
    examples, v2 = squad.read_squad(data)  # data errors first: they cost no model load
    model = load_model(model_dir, task="question-answering")
    tok = load_tokenizer(model_dir)
    scored, held = _hold_apart(examples, s.calib_size, calib is not None, limit)
    calib_texts = (
        read_texts(calib, limit=s.calib_size)
        if calib
        else [(ex.question, ex.context) for ex in held]
    )
    golds = {ex.id: ex.answers for ex in scored}

    def score(variant: Any, label: str) -> dict[str, float]:
        preds = squad.predict_squad(
            variant,
            tok,
            scored,
            v2,
            s.max_length,
            s.doc_stride,
            batch_size=s.batch_size,
            desc=f"squad ({label})",
            progress=s.progress,
        )
        return squad_scores(preds, golds)

    calibration = _calibration(tok, calib_texts, s.max_length, model)
    info = {"squad_version": "2.0" if v2 else "1.1"}
    return Task(
        "squad",
        model,
        calibration,
        ("f1", "exact_match"),
        len(scored),
        score,
        info,
        batch_size=s.batch_size,
        max_length=s.max_length,
    )


def classification_task(
    model_dir: PathLike,
    data: PathLike,
    limit: int | None,
    calib: PathLike | None,
    s: EvalSettings,
    name: str,
) -> Task:
    # NLI is a pair task: a row missing its hypothesis is an error, not a single sentence
    pairs = True if name in ("mnli", "snli") else None
    items = classify.read_labelled(data, pairs=pairs, task=name)
    model = load_model(model_dir, task="sequence-classification")
    tok = load_tokenizer(model_dir)
    scored, held = _hold_apart(items, s.calib_size, calib is not None, limit)
    gold = classify.label_ids(scored, model.config)
    max_len = min(s.max_length, 128)
    calib_texts = (
        read_texts(calib, limit=s.calib_size)
        if calib
        else [(it.text, it.pair) if it.pair else it.text for it in held]
    )

    def score(variant: Any, label: str) -> dict[str, float]:
        pred = classify.predict_labels(
            variant,
            tok,
            scored,
            s.batch_size,
            max_len,
            desc=f"{name} ({label})",
            progress=s.progress,
        )
        return {"accuracy": accuracy(pred, gold)}

    calibration = _calibration(tok, calib_texts, max_len, model)
    return Task(
        name,
        model,
        calibration,
        ("accuracy",),
        len(scored),
        score,
        batch_size=s.batch_size,
        max_length=max_len,
    )


TASKS = ("squad", "mnli", "snli", "glue", "probe")


def prepare_task(
    model_dir: str | Path,
    task: str,
    data: str | Path,
    limit: int | None = None,
    calib: str | Path | None = None,
    train: str | Path | None = None,
    settings: EvalSettings | None = None,
) -> Task:
    s = settings or EvalSettings()
    if task not in TASKS:
        raise SquantError(f"unknown task {task!r}; choose from {', '.join(TASKS)}")
    if limit is not None and limit < 1:
        raise SquantError(f"--limit must be >= 1, got {limit}")
    if task == "squad":
        return squad_task(model_dir, data, limit, calib, s)
    if task == "probe":
        if train is None:
            raise SquantError(
                "--task probe needs --train FILE (labelled pairs to fit the probe on)"
            )
        return prepare_probe(model_dir, data, train, limit, ProbeSettings(), progress=s.progress)
    return classification_task(model_dir, data, limit, calib, s, task)


def evaluate(
    model_dir: str | Path,
    task: str,
    data: str | Path,
    variants: str | tuple[str, ...] = ("fp32", "static", "dynamic"),
    alpha: float | str | None = None,
    limit: int | None = None,
    calib: str | Path | None = None,
    train: str | Path | None = None,
    settings: EvalSettings | None = None,
) -> dict[str, Any]:
    """Metric(s) per variant, percent; with relative loss vs FP32 when FP32 is among them."""
    s = settings or EvalSettings()
    parse_variants(variants)  # a typo fails before the model loads
    t = prepare_task(model_dir, task, data, limit, calib, train, s)
    results = score_variants(t, variants, alpha, s.progress)
    fp32 = results.get("fp32")
    if fp32 is not None:
        for r in results.values():
            losses = {m: relative_loss(r[m], fp32[m]) for m in t.metrics}
            r["relative_loss_percent"] = losses  # type: ignore[assignment]
    return {
        "task": task,
        **t.info,
        "n_scored": t.n_scored,
        "metrics": list(t.metrics),
        "results": results,
        "model": str(model_dir),
        "data": str(data),
        "alpha": alpha,
        "settings": asdict(s),
    }


def format_results(record: dict[str, Any]) -> list[list[Any]]:
    """Rows shaped like the paper's Table 15: variant, metrics, loss vs FP32."""
    rows = []
    for name, r in record["results"].items():
        row = [name]
        for m in record["metrics"]:
            row.append(f"{r[m]:.5f}" if "cosine" in m else f"{r[m]:.2f}")
        loss = r.get("relative_loss_percent", {}).get(record["metrics"][0])
        row.append(f"{loss:+.2f}%" if loss is not None else None)
        rows.append(row)
    return rows
