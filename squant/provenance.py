"""Where a result came from: the command, the code, the host and the library versions.

Every JSON result squant writes (and the benchmarks') carries this, so a figure can be traced
to what produced it and compared only with figures from a like host."""

from __future__ import annotations

import contextlib
import json
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from .hardware import cpu_features
from .version import __version__

PACKAGES = ("torch", "torchao", "transformers", "openvino", "nncf", "onnxruntime")


def versions() -> dict[str, str]:
    """Python's and the installed versions of the libraries results depend on."""
    out = {"python": platform.python_version(), "squant": __version__}
    for pkg in PACKAGES:
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[pkg] = metadata.version(pkg)
    return out


def commit(path: Path | None = None) -> str | None:
    """The git commit of the checkout squant runs from ("-dirty" with uncommitted changes to
    tracked files); None when it is not a git checkout (an installed wheel)."""
    root = path or Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()

    try:
        if not (root / ".git").exists():
            return None
        dirty = git("status", "--porcelain", "--untracked-files=no")
        return git("rev-parse", "--short", "HEAD") + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def provenance(argv: list[str] | None = None) -> dict[str, Any]:
    """The command (argv, default this process's), commit, host and versions of a result."""
    features = cpu_features()
    return {
        "command": " ".join(argv if argv is not None else sys.argv),
        "commit": commit(),
        "hardware": features.to_dict(),
        "versions": versions(),
    }


def write_result(path: Path, record: dict[str, Any]) -> None:
    """Write a result as JSON at `path` (its directory created, the file replaced atomically)
    with this run's provenance added."""
    from .files import write_output_file

    path.parent.mkdir(parents=True, exist_ok=True)
    write_output_file(path, json.dumps({**record, "provenance": provenance()}, indent=2))
