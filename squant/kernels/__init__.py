"""squant's own CPU kernels (C++), built once per source and torch version, then cached.

The library registers its ops with PyTorch's dispatcher under the ``squant`` namespace
(``torch.ops.squant.int8_attention``), so eager code, torch.compile graphs and AOTInductor
packages all call the same kernel. A package that uses it loads in a process without squant
after ``torch.ops.load_library(<deploy dir>/<library>)``; squant.export puts the library there.

The build needs a C++ compiler (g++ or clang++, as inductor does) and ninja (a dependency of
squant, so installed with it). It takes ~30-60 s once; later processes load the cached
library in milliseconds.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import torch

from ..cache import cache_root
from ..errors import SquantError, first_line

SOURCES = (
    "int8_attention.cpp",
    "int8_linear.cpp",
    "layer_norm.cpp",
    "memory_pool.cpp",
    "package_runner.cpp",
    "weight_quantize.cpp",
)
# included by the sources: part of what a build depends on
HEADERS = ("internal.h",)
LIBRARY_NAME = "squant_kernels"
# -fno-math-errno: std::lrint becomes one instruction (the vector paths round the same way);
# -fopenmp: at::parallel_for is a header template over OpenMP pragmas, serial without it
CFLAGS = ("-O3", "-std=c++17", "-fno-math-errno", "-fopenmp")


def kernel_cache() -> Path:
    """Where built kernels live: $SQUANT_KERNEL_CACHE, else kernels/ under squant's cache."""
    env = os.environ.get("SQUANT_KERNEL_CACHE")
    return Path(env) if env else cache_root() / "kernels"


def _source_paths() -> list[Path]:
    here = Path(__file__).parent
    return [here / name for name in SOURCES]


def _header_paths() -> list[Path]:
    here = Path(__file__).parent
    return [here / name for name in HEADERS]


def build_key() -> str:
    """Hash of what the library depends on: its sources, torch's version and the C++ ABI."""
    digest = hashlib.sha256()
    for path in [*_source_paths(), *_header_paths()]:
        digest.update(path.read_bytes())
    digest.update(" ".join(CFLAGS).encode())
    digest.update(torch.__version__.encode())
    digest.update(str(torch._C._GLIBCXX_USE_CXX11_ABI).encode())
    return digest.hexdigest()[:16]


@contextlib.contextmanager
def _tools_on_path() -> Iterator[None]:
    """ninja comes with squant into this interpreter's environment, whose bin directory is
    not on PATH unless the environment was activated."""
    old = os.environ.get("PATH", "")
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), old])
    try:
        yield
    finally:
        os.environ["PATH"] = old


def _compiler() -> str | None:
    for name in (os.environ.get("CXX", ""), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return name
    return None


@functools.cache
def library_path() -> Path:
    """Build (once per build_key) and load the kernel library; returns its path."""
    return load_or_build(kernel_cache())


def registered() -> bool:
    """Whether a squant kernel library is loaded in this process already."""
    return registered_op("squant::int8_attention")


def registered_op(name: str) -> bool:
    """Whether the op `name` ("squant::...") is registered in this process."""
    try:
        torch._C._dispatch_find_schema_or_throw(name, "")
    except RuntimeError:
        return False
    return True


def built() -> bool:
    """Whether this squant's kernel library is built already (loading it then costs
    milliseconds, not a ~30 s build)."""
    return _built_path(kernel_cache()).is_file()


def _built_path(root: Path) -> Path:
    name = f"{LIBRARY_NAME}_{build_key()}"
    return root / name / f"{name}.so"


def load_library(path: Path) -> None:
    """torch.ops.load_library, once per process: a second library registering the `squant`
    namespace (the same kernels from a deploy directory, say) would abort the process."""
    if not registered():
        torch.ops.load_library(str(path))  # type: ignore[no-untyped-call]


def load_or_build(root: Path) -> Path:
    """The library under root, built there first if it is not; loaded into this process."""
    from torch.utils import cpp_extension

    built = _built_path(root)
    directory, name = built.parent, built.stem
    if built.is_file():
        load_library(built)
        return built
    if _compiler() is None:
        raise SquantError(
            "squant's int8 attention kernel is built on first use and needs a C++ compiler "
            "(g++ or clang++, e.g. `apt install g++`); none was found. Quantize with "
            "attention='float' to run without it"
        )
    directory.mkdir(parents=True, exist_ok=True)
    print(f"squant: building its C++ kernels once into {directory} (~30 s)", file=sys.stderr)
    try:
        with _tools_on_path():
            cpp_extension.load(
                name=name,
                sources=[str(p) for p in _source_paths()],
                extra_cflags=list(CFLAGS),
                extra_ldflags=["-fopenmp"],
                build_directory=str(directory),
                is_python_module=False,
                verbose=False,
            )
    except (RuntimeError, OSError, ImportError) as exc:
        raise SquantError(
            f"building squant's C++ kernels in {directory} failed: {first_line(exc)}"
        ) from exc
    return built


@functools.cache
def load() -> None:
    """Make ``torch.ops.squant.*`` available in this process (building it if needed)."""
    library_path()
    _register_fake()


def _register_fake() -> None:
    # The output's shape for tracing (torch.compile, torch.export): [B, S, H·D] from
    # [B, S, 3·H·D]. Written in Python so symbolic sizes work; not needed to run a package.
    @torch.library.register_fake("squant::int8_attention")
    def _(
        qkv: torch.Tensor,
        key_mask: torch.Tensor | None,
        num_heads: int,
        scaling: float,
        isa: str = "auto",
    ) -> torch.Tensor:
        b, s, w = qkv.shape
        return qkv.new_empty((b, s, w // 3))

    @torch.library.register_fake("squant::int8_linear")
    def _(
        x: torch.Tensor,
        packed_weight: torch.Tensor,
        compensation: torch.Tensor,
        x_scale: float,
        x_zero_point: int,
        weight_scale: torch.Tensor,
        bias: torch.Tensor | None,
        out_features: int,
        activation: str = "none",
        out_dtype: torch.dtype | None = None,
        row_scale: torch.Tensor | None = None,
        side_x: torch.Tensor | None = None,
        side_w: torch.Tensor | None = None,
        epilogue: str = "auto",
    ) -> torch.Tensor:
        return x.new_empty((x.shape[0], out_features), dtype=out_dtype or torch.float32)

    @torch.library.register_fake("squant::quantize_per_token")
    def _(
        x: torch.Tensor,
        multiplier: torch.Tensor | None = None,
        side_index: torch.Tensor | None = None,
        path: str = "auto",
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        rows, width = x.shape
        side = 0 if side_index is None else side_index.shape[0]
        return (
            x.new_empty((rows, width), dtype=torch.uint8),
            x.new_empty((rows, 1), dtype=torch.float32),
            x.new_empty((rows, side), dtype=torch.float32),
        )

    @torch.library.register_fake("squant::int8_linear_quantize_rows")
    def _(
        x: torch.Tensor,
        packed_weight: torch.Tensor,
        compensation: torch.Tensor,
        x_scale: float,
        x_zero_point: int,
        weight_scale: torch.Tensor,
        bias: torch.Tensor | None,
        out_features: int,
        activation: str = "none",
        row_scale: torch.Tensor | None = None,
        side_x: torch.Tensor | None = None,
        side_w: torch.Tensor | None = None,
        multiplier: torch.Tensor | None = None,
        side_index: torch.Tensor | None = None,
        path: str = "auto",
        order: str = "auto",
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        rows = x.shape[0]
        side = 0 if side_index is None else side_index.shape[0]
        return (
            x.new_empty((rows, out_features), dtype=torch.uint8),
            x.new_empty((rows, 1), dtype=torch.float32),
            x.new_empty((rows, side), dtype=torch.float32),
        )

    @torch.library.register_fake("squant::add_layer_norm_quantize")
    def _(
        x: torch.Tensor,
        residual: torch.Tensor | None,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        eps: float,
        multiplier: torch.Tensor,
        zero_point: int,
        path: str = "auto",
    ) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = x.shape[-1]
        return x.new_empty(x.shape), x.new_empty((x.numel() // hidden, hidden), dtype=torch.uint8)

    @torch.library.register_fake("squant::add_layer_norm_quantize_rows")
    def _(
        x: torch.Tensor,
        residual: torch.Tensor | None,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        eps: float,
        multiplier: torch.Tensor | None = None,
        side_index: torch.Tensor | None = None,
        path: str = "auto",
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        hidden = x.shape[-1]
        rows = x.numel() // hidden
        side = 0 if side_index is None else side_index.shape[0]
        return (
            x.new_empty(x.shape),
            x.new_empty((rows, hidden), dtype=torch.uint8),
            x.new_empty((rows, 1)),
            x.new_empty((rows, side)),
        )

    @torch.library.register_fake("squant::int8_linear_attention")
    def _(
        x: torch.Tensor,
        packed_weight: torch.Tensor,
        compensation: torch.Tensor,
        x_scale: float,
        x_zero_point: int,
        weight_scale: torch.Tensor,
        bias: torch.Tensor | None,
        out_features: int,
        row_scale: torch.Tensor | None,
        side_x: torch.Tensor | None,
        side_w: torch.Tensor | None,
        key_mask: torch.Tensor | None,
        batch: int,
        num_heads: int,
        scaling: float,
        isa: str = "auto",
    ) -> torch.Tensor:
        return x.new_empty((batch, x.shape[0] // batch, out_features // 3), dtype=torch.float32)


def supported_isas() -> tuple[str, ...]:
    """The kernel paths this CPU can run, fastest first (the last is always "scalar")."""
    load()
    return tuple(torch.ops.squant.int8_attention_isas())
