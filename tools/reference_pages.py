"""docs/api.md and docs/cli.md, generated: the Python API from its docstrings and signatures,
the command line from its argparse parsers, so the reference pages cannot drift from the code.

    python tools/reference_pages.py          # rewrite both pages
    python tools/reference_pages.py --check  # exit 1 if either is stale (tests/test_docs.py)
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import sys
import types
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
API_PAGE = ROOT / "docs" / "api.md"
CLI_PAGE = ROOT / "docs" / "cli.md"

# What the API page documents, in reading order: (section, [dotted names]). Everything in
# squant.__all__ must appear (tests/test_docs.py checks it); the rest are the documented
# entry points of the serving and bulk-embedding layers.
API_SECTIONS: list[tuple[str, list[str]]] = [
    (
        "Quantize, save, load",
        [
            "squant.SmoothQuantConfig",
            "squant.quantize",
            "squant.smooth",
            "squant.save",
            "squant.load",
        ],
    ),
    (
        "Compile and deploy",
        [
            "squant.CompileConfig",
            "squant.compile",
            "squant.ExportConfig",
            "squant.export",
            "squant.load_exported",
            "squant.load_packaged",
        ],
    ),
    ("Errors", ["squant.SquantError"]),
    ("Models and variants", ["squant.models", "squant.sentence_transformer", "squant.variants"]),
    (
        "Serving",
        [
            "squant.engine.config.ServeConfig",
            "squant.engine.loading.engine_for",
            "squant.serve.listen.ListenConfig",
            "squant.serve.server.serve_http",
            "squant.serve.ray_app.RayConfig",
            "squant.serve.ray_app.application",
        ],
    ),
    ("Bulk embedding", [f"squant.embed.{name}" for name in ("embed_file", "embed_texts")]),
]

HEADER = (
    "Generated from the code by `python tools/reference_pages.py`; a test fails when it is stale."
)


def resolve(dotted: str) -> Any:
    """The object a dotted name points to: the shortest importable module, then attributes
    (so `squant.quantize` is the function the package exports, not a module of that name)."""
    parts = dotted.split(".")
    for cut in range(1, len(parts) + 1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except (ModuleNotFoundError, AttributeError):
            continue
        return obj
    raise ImportError(dotted)


def _doc(obj: Any) -> str:
    return inspect.cleandoc(obj.__doc__ or "").strip() or "(no docstring)"


def _type_name(annotation: Any) -> str:
    if isinstance(annotation, str):
        return annotation
    if isinstance(annotation, type) and not typing.get_args(annotation):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def _signature(name: str, obj: Callable[..., Any]) -> str:
    try:
        sig = str(inspect.signature(obj))
    except (TypeError, ValueError):
        sig = "(...)"
    return f"{name}{sig}"


def _fields_table(cls: type) -> list[str]:
    fields = dataclasses.fields(cls)
    helped = any("help" in field.metadata for field in fields)
    rows = ["| field | type | default |" + (" meaning |" if helped else ""), "|---|---|---|"]
    rows[1] += "---|" if helped else ""
    hints = typing.get_type_hints(cls)
    for field in fields:
        if field.default is not dataclasses.MISSING:
            default = repr(field.default)
        elif field.default_factory is not dataclasses.MISSING:
            default = repr(field.default_factory())
        else:
            default = "required"
        meaning = str(field.metadata.get("help", "")).replace("|", "\\|").replace("\n", " ")
        kind = _type_name(hints.get(field.name, field.type)).replace("|", "\\|")
        row = f"| `{field.name}` | `{kind}` | `{default}` |"
        rows.append(row + (f" {meaning} |" if helped else ""))
    return rows


def _entry(dotted: str, obj: Any, level: str = "###") -> list[str]:
    lines = [f"{level} `{dotted}`", ""]
    if inspect.ismodule(obj):
        lines += ["```text", _doc(obj), "```", ""]
        for name, member in _public_functions(obj):
            lines += _entry(f"{dotted}.{name}", member, level + "#")
        return lines
    lines += ["```python", _signature(dotted, obj), "```", ""]
    # docstrings are laid out for a terminal (indented argument lists): shown as written
    lines += ["```text", _doc(obj), "```", ""]
    if dataclasses.is_dataclass(obj) and isinstance(obj, type):
        lines += [*_fields_table(obj), ""]
    return lines


def _public_functions(module: types.ModuleType) -> Iterator[tuple[str, Any]]:
    """Functions and classes defined in the module itself, not underscored, documented."""
    for name, member in vars(module).items():
        if name.startswith("_") or not (inspect.isfunction(member) or inspect.isclass(member)):
            continue
        if getattr(member, "__module__", None) == module.__name__ and member.__doc__:
            yield name, member


def api_page() -> str:
    lines = ["# Python API reference", "", HEADER, ""]
    for section, names in API_SECTIONS:
        lines += [f"## {section}", ""]
        for dotted in names:
            lines += _entry(dotted, resolve(dotted))
    return "\n".join(lines).rstrip() + "\n"


def cli_page() -> str:
    from squant.cli import COMMANDS, build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    lines = ["# Command-line reference", "", HEADER, ""]
    lines += [
        "Every command ends a failure with one `squant CMD: error: ...` line and exit code 2,",
        "and writes nothing then.",
        "",
    ]
    for name in COMMANDS:
        help_text = sub.choices[name].format_help().replace("\t", "    ")
        lines += [f"## `squant {name}`", "", "```text", help_text.rstrip(), "```", ""]
    return "\n".join(lines).rstrip() + "\n"


def pages() -> dict[Path, str]:
    # argparse wraps help to the terminal's width: fixed here so the pages do not depend on it
    import os

    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"
    try:
        return {API_PAGE: api_page(), CLI_PAGE: cli_page()}
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a page is stale")
    args = parser.parse_args()
    stale = []
    for path, text in pages().items():
        if path.exists() and path.read_text(encoding="utf-8") == text:
            continue
        if args.check:
            stale.append(str(path.relative_to(ROOT)))
        else:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path.relative_to(ROOT)}")
    if stale:
        print(f"stale: {', '.join(stale)} (run python tools/reference_pages.py)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
