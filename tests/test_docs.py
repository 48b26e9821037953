"""The README is a front door and docs/ the reference: links that resolve, every page in
the site's navigation, no page that speaks of the project's own history."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if "://" in target or target.startswith("mailto:"):
            continue
        assert (page.parent / target).exists(), f"{page.name}: broken link {target}"


def test_every_docs_page_is_in_the_site_navigation():
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for page in (ROOT / "docs").glob("*.md"):
        assert f": {page.name}" in nav, f"{page.name} is missing from mkdocs.yml nav"


def test_the_readme_is_a_front_door():
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 200


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_pages_speak_of_the_product_not_its_history(page):
    text = page.read_text(encoding="utf-8")
    for pattern in (r"\bstop \d+\b", r"\bissue \d+\b", r"TARGETS\.md", r"\bthis stop\b"):
        assert not re.search(pattern, text, flags=re.I), f"{page.name}: {pattern}"


def _script(relative: str):
    """A repository script (not a package module) imported by path."""
    import importlib.util

    path = ROOT / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _results_index():
    return _script("benchmarks/results_index.py")


def test_every_result_file_is_cited_and_every_citation_exists():
    index = _results_index()
    cited = index.citations()
    files = index.result_files()
    uncited = [f for f in files if not index.cited_by(f, cited)]
    assert not uncited, f"superseded results (no page cites them): remove {uncited}"
    broken = [c for c in cited if not any(index.fnmatch.fnmatchcase(f, c) for f in files)]
    assert not broken, f"pages cite results that do not exist: {broken}"


def test_the_results_index_is_current():
    index = _results_index()
    assert index.INDEX.read_text(encoding="utf-8") == index.render(), (
        "benchmarks/results/INDEX.md is stale: run python benchmarks/results_index.py"
    )


def _reference_pages():
    return _script("tools/reference_pages.py")


def test_the_api_and_cli_reference_pages_are_current():
    stale = [
        str(path.relative_to(ROOT))
        for path, text in _reference_pages().pages().items()
        if not path.exists() or path.read_text(encoding="utf-8") != text
    ]
    assert not stale, f"stale: {stale} (run python tools/reference_pages.py)"


def test_the_api_reference_documents_every_public_name():
    import squant

    documented = {name for _, names in _reference_pages().API_SECTIONS for name in names}
    missing = [name for name in squant.__all__ if f"squant.{name}" not in documented]
    assert not missing, f"squant.__all__ names missing from docs/api.md: {missing}"


def test_every_public_name_imports():
    import squant

    assert len(squant.__all__) > 10
    broken = [name for name in squant.__all__ if getattr(squant, name, None) is None]
    assert not broken, f"squant.__all__ names that do not import: {broken}"
