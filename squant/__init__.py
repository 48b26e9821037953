"""squant: SmoothQuant INT8 for BERT-family encoders on CPUs, with PyTorch alone.

The package is layered, each layer importing only itself and those listed before it
(tests/test_imports.py holds it to that):
    errors, files, hardware, data, cache, provenance, version   the shared low layer
    kernels      squant's C++ kernels (INT8 linear and attention, the GIL-free package runner)
    quant        the quantization core (layouts, SmoothQuant, INT8 linears and attention)
    runtime      compile, export (.pt2), shapes, outputs, timing, core placement
    checkpoint   loading, saving, sentence-transformers, the public quantize
    bench        speed: variants by name, timing runs, roofline, reports
    eval         accuracy (and tune, which weighs it against speed)
    engine       batching, workers and execution for serving and bulk embedding (no HTTP)
    serve        the HTTP server on the engine
    embed        bulk embedding, local or on Ray Data
    commands     the CLI's commands (cli.py dispatches to them)
"""

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType
from typing import Any

from .bench import variants
from .checkpoint import models, sentence_transformer
from .checkpoint.quantize_api import quantize
from .checkpoint.serialization import load, save
from .errors import SquantError
from .quant.config import SmoothQuantConfig
from .quant.quantize import smooth
from .runtime.compiler import CompileConfig, compile
from .runtime.export import ExportConfig, export, load_exported, load_packaged
from .version import __version__ as __version__

__all__ = [
    "CompileConfig",
    "ExportConfig",
    "SmoothQuantConfig",
    "SquantError",
    "compile",
    "export",
    "load",
    "load_exported",
    "load_packaged",
    "models",
    "quantize",
    "save",
    "sentence_transformer",
    "smooth",
    "variants",
]

# Module paths from before the layers still import, as the same module objects: users'
# `from squant.compiler import CompileConfig` keeps working, and a saved sentence-transformers
# directory declares `squant.st_module.Int8Transformer` (a stable name: kept for good).
MOVED_MODULES = {
    **{
        f"squant.{m}": f"squant.quant.{m}"
        for m in (
            "attention",
            "calibrate",
            "config",
            "int8",
            "mappings",
            "monitor",
            "qlinear",
            "quantize",
            "record",
            "smooth",
        )
    },
    **{
        f"squant.{m}": f"squant.checkpoint.{m}"
        for m in (
            "models",
            "pipeline",
            "quantize_api",
            "sentence_transformer",
            "serialization",
            "st_module",
        )
    },
    **{
        f"squant.{m}": f"squant.runtime.{m}"
        for m in ("compiler", "export", "outputs", "placement", "shapes", "timing")
    },
    **{f"squant.{m}": f"squant.bench.{m}" for m in ("analyze", "report", "variants")},
    **{
        f"squant.serve.{m}": f"squant.engine.{m}"
        for m in (
            "batching",
            "config",
            "engine",
            "executor",
            "loading",
            "local_engine",
            "model_process",
            "package_cache",
            "process_memory",
            "runtime",
        )
    },
    "squant.tune": "squant.eval.tune",
    "squant.ray_data": "squant.embed.ray_data",
}


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old module path as the module now at its new one (loaded on first use)."""

    def __init__(self) -> None:
        self._specs: dict[str, importlib.machinery.ModuleSpec | None] = {}

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name not in MOVED_MODULES:
            return None
        return importlib.util.spec_from_loader(name, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(MOVED_MODULES[spec.name])
        # the import system is about to set the alias's spec on it: exec_module puts it back
        self._specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        assert module.__spec__ is not None
        module.__spec__ = self._specs.pop(module.__spec__.name)


def _alias_moved_modules() -> None:
    for old, new in MOVED_MODULES.items():
        # loaded already: aliased now, so that `import squant.export` never replaces the
        # function squant.export with the module (the import system sets the attribute)
        if new in sys.modules:
            sys.modules.setdefault(old, sys.modules[new])
            parent, leaf = old.rsplit(".", 1)
            # `import squant.compiler; squant.compiler.X` (old paths directly under squant)
            if parent == "squant" and leaf not in globals():
                globals()[leaf] = sys.modules[new]
    if not any(isinstance(f, _MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.append(_MovedModuleFinder())


_alias_moved_modules()
