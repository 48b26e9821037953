"""Evaluation data from Hugging Face `datasets` (optional extra `squant[data]`): a directory
written by `save_to_disk`, or a Hub dataset id (`squad`, `glue/mnli`, `stanfordnlp/snli`),
optionally with a split after a colon (`glue/mnli:validation_mismatched`). Hub ids go
through the datasets cache, so a dataset fetched once works offline.

Rows come back as plain dicts with class labels as their names (so the checkpoint's own
id2label maps them, as for local files); the readers in classify.py and squad.py parse them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import SquantError, first_line

# Benchmarks whose tasks are configs of one dataset: "glue/mnli" is glue's mnli config (any
# other two-part name is an org/name repository id; three parts are org/name/config)
BENCHMARK_FAMILIES = ("glue", "super_glue")

# the split scored when none is named: the labelled evaluation split of each benchmark
DEFAULT_SPLIT = {
    "squad": "validation",
    "mnli": "validation_matched",
    "snli": "test",
    "glue": "validation",
}
SAVED_MARKERS = ("dataset_dict.json", "dataset_info.json", "state.json")


def _name_and_split(spec: str | Path) -> tuple[str, str]:
    """("glue/mnli", "validation_mismatched") from "glue/mnli:validation_mismatched"; the
    split is what follows the last colon ("" when there is none)."""
    name, _, split = str(spec).rpartition(":")
    return (name, split) if name else (split, "")


def is_dataset(spec: str | Path) -> bool:
    """A saved datasets directory, or (when no such file or directory exists) a Hub id."""
    name, _ = _name_and_split(spec)
    if Path(name).is_dir():
        return any((Path(name) / m).is_file() for m in SAVED_MARKERS)
    text = str(spec)
    if Path(text).exists() or text.endswith((".json", ".jsonl", ".tsv", ".csv", ".txt")):
        return False
    parts = name.split("/")
    return 1 <= len(parts) <= 3 and all(p and not p.startswith(".") for p in parts)


def rows(spec: str | Path, task: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, row) for each row of the dataset's split, class labels as names; -1 labels
    (no annotator consensus in SNLI/MNLI) come as "-", which the readers skip."""
    dataset = _load(str(spec), task)
    features = getattr(dataset, "features", {}) or {}
    names = {
        key: feature.names
        for key, feature in features.items()
        if type(feature).__name__ == "ClassLabel"
    }
    for n, row in enumerate(dataset):
        for key, label_names in names.items():
            value = row.get(key)
            if isinstance(value, int):
                row[key] = label_names[value] if 0 <= value < len(label_names) else "-"
        yield f"{spec}[{n}]", row


def _load(spec: str, task: str) -> Any:
    try:
        import datasets
    except ImportError:
        raise SquantError(
            f"{spec} is not a file; reading Hugging Face datasets needs the extra: "
            "pip install 'squant[data]'"
        ) from None
    name, split = _name_and_split(spec)
    split = split or DEFAULT_SPLIT.get(task, "validation")
    try:
        if Path(name).is_dir():
            loaded = datasets.load_from_disk(name)
        else:
            repo, config = _hub_id(name)
            loaded = datasets.load_dataset(repo, config)
    except Exception as e:  # datasets raises many kinds (offline, missing, bad files)
        raise SquantError(f"cannot load dataset {name}: {first_line(e)}") from None
    if hasattr(loaded, "keys"):  # a DatasetDict: pick the split
        if split not in loaded:
            raise SquantError(
                f"dataset {name} has no split {split!r}; it has {', '.join(loaded.keys())} "
                f"(name one as {name}:SPLIT)"
            )
        return loaded[split]
    return loaded


def _hub_id(name: str) -> tuple[str, str | None]:
    """(repository id, config name) of a Hub dataset spec."""
    parts = name.split("/")
    if len(parts) == 3:
        return f"{parts[0]}/{parts[1]}", parts[2]
    if len(parts) == 2 and parts[0] in BENCHMARK_FAMILIES:
        return parts[0], parts[1]
    return name, None
