"""The package's import graph: no module imports one that (directly or not) imports it back,
at module level (so every module can be imported on its own and in any order) or inside a
function (a deferred import hides a circle from the interpreter, not from a reader: the
layers go one way)."""

import ast
from pathlib import Path

import squant

ROOT = Path(squant.__file__).parent


def _module_graph(deferred: bool = False) -> dict[str, set[str]]:
    modules = {}
    for path in ROOT.rglob("*.py"):
        parts = ("squant", *path.relative_to(ROOT).with_suffix("").parts)
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree) if deferred else tree.body:
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")
                if node.level:
                    base = base[: len(base) - (node.level - 1)]
                    origin = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    origin = node.module or ""
                targets = [f"{origin}.{a.name}" for a in node.names] + [origin]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            for t in targets:
                if t in modules and t != name:
                    graph[name].add(t)
                    break
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of the graph (as a path back to its start), or None."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt, [*path, nxt])):
                return found
        state[node] = 2
        return None

    for module in sorted(graph):
        if module not in state and (found := visit(module, [module])):
            return found
    return None


def test_no_import_cycles():
    graph = _module_graph()
    assert len(graph) > 40  # the walk found the package
    assert (
        "squant.quant.quantize" in graph["squant.checkpoint.serialization"]
    )  # and reads relative imports
    assert find_cycle(graph) is None


def test_no_import_cycles_through_deferred_imports():
    graph = _module_graph(deferred=True)
    assert "squant.engine.local_engine" in graph["squant.engine.model_process"]  # reads functions
    assert find_cycle(graph) is None


def test_the_cycle_check_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


# squant's layers, lowest first (squant/__init__.py lists them): a module imports only its own
# layer and those below it. The shared low layer's modules may import one another.
LAYERS = (
    ("squant.errors", "squant.files", "squant.hardware", "squant.data", "squant.cache"),
    ("squant.provenance", "squant.version"),
    ("squant.kernels",),
    ("squant.quant",),
    ("squant.runtime",),
    ("squant.checkpoint",),
    ("squant.bench",),
    ("squant.eval",),
    ("squant.engine",),
    ("squant.serve",),
    ("squant.embed",),
    ("squant.commands",),
    ("squant.cli",),
)
LOW = {*LAYERS[0], *LAYERS[1]}


def _layer(module: str) -> tuple[int, str]:
    """(rank, layer) of a module; the package itself (squant/__init__) is above them all."""
    for rank, names in enumerate(LAYERS):
        for name in names:
            if module == name or module.startswith(name + "."):
                return rank, "low" if name in LOW else name
    assert module == "squant", f"{module} is in no layer: add it to LAYERS"
    return len(LAYERS), module


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for module, targets in sorted(graph.items()):
        rank, layer = _layer(module)
        for target in sorted(targets):
            target_rank, target_layer = _layer(target)
            if target_rank > rank or (target_rank == rank and target_layer != layer):
                found.append(f"{module} -> {target}")
    return found


def test_layers_import_downward_only():
    graph = _module_graph(deferred=True)
    assert upward_imports(graph) == []
    top = [p.stem for p in ROOT.glob("*.py") if p.stem != "__init__"]
    assert len(top) <= 8, f"top-level modules beside the layer packages: {sorted(top)}"


def test_the_layer_check_finds_an_upward_import():
    graph = {"squant.quant.int8": {"squant.engine.engine"}, "squant.engine.engine": set()}
    assert upward_imports(graph) == ["squant.quant.int8 -> squant.engine.engine"]
    assert upward_imports({"squant.serve.app": {"squant.quant.int8"}}) == []


def test_old_module_paths_import_as_the_moved_modules():
    import importlib
    import sys

    for old, new in squant.MOVED_MODULES.items():
        assert importlib.import_module(old) is importlib.import_module(new), old
        assert sys.modules[new].__spec__.name == new  # the alias left the module its own spec
    assert callable(squant.export) and callable(squant.quantize) and callable(squant.smooth)
    from squant.st_module import Int8Transformer  # what saved directories declare

    assert Int8Transformer.__module__ == "squant.checkpoint.st_module"
