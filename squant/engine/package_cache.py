"""A quantized directory served from an AOTInductor package that is built once and cached.

Compiling a quantized model when a server starts costs minutes on a small host, every start:
real all-MiniLM-L6-v2 static INT8 took 113-147 s to become ready on 2 AVX2 cores, of which
two dynamo graphs cost ~45 s each (tracing, AOT autograd, inductor lowering, a C++ build), and
inductor's own FX graph cache cannot keep them (oneDNN-packed weights are graph constants it
will not pickle). Exported once instead, with dynamic batch and sequence length, the same model
is one package (~35 s to build); every later start loads it in well under a second, and it
never compiles under traffic. Run through squant's kernel library it releases the GIL
(kernels/package_runner.py), so instances on their own cores run at once.

The cache entry is keyed by the model directory's content (files.model_sha256), squant's and
torch's versions and the CPU's ISA: a re-quantized model, an upgrade or another CPU builds a
new package, never loads a stale one. It lives in `packages/` under squant's cache
($SQUANT_CACHE, else ~/.cache/squant); removing that folder only costs a rebuild.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import shutil
import sys
import time
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..cache import cache_root
from ..errors import SquantError, first_line
from ..hardware import cpu_features
from ..runtime.compiler import CompileConfig, FloatDtype
from ..version import __version__


def package_cache() -> Path:
    """Where cached packages live: packages/ under squant's cache."""
    return cache_root() / "packages"


def package_key(model_dir: str | Path) -> str:
    """The cache key of a model directory's package (see the module docstring)."""
    from ..files import model_sha256

    content = model_sha256(model_dir)
    if content is None:
        raise SquantError(f"{model_dir} is not a directory")
    digest = hashlib.sha256()
    for part in (content, __version__, torch.__version__, " ".join(sorted(cpu_features().isa))):
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()[:24]


def cached_package(
    model_dir: str | Path,
    model: nn.Module,
    tokenizer: Any,
    num_runners: int,
    check_inputs: Mapping[str, Tensor],
    min_cosine: float = CompileConfig.min_cosine,
) -> nn.Module | None:
    """The model as its cached package (built first when there is none), called like the
    model: any batch, any length from 1 to the model's limit. The package is checked against
    the eager `model` on check_inputs (cosine over real tokens >= min_cosine) at every load.
    None, with a warning that says why, when it cannot be built, loaded or does not agree:
    the caller then compiles as before."""
    from ..runtime.compiler import agreement
    from ..runtime.export import MANIFEST, ExportConfig, load_packaged, padded_for_serving
    from ..runtime.outputs import first_tensor

    directory = package_cache() / package_key(model_dir)
    pad = int(getattr(tokenizer, "pad_token_id", 0) or 0)
    with torch.no_grad():
        reference = first_tensor(model(**check_inputs))
    # the float parts squant.compile would pick (BF16 only for a float model on a CPU with
    # native BF16), then FP32 when they do not hold on this model
    tries: list[FloatDtype] = (
        ["auto", "fp32"] if ExportConfig().resolved_dtype(model) != torch.float32 else ["fp32"]
    )
    cos = 0.0
    for float_dtype in tries:
        try:
            with _locked(directory):  # replicas starting together build it once
                if not (directory / MANIFEST).is_file():
                    _build(model, directory, tokenizer, float_dtype)
                package = load_packaged(directory, num_runners=num_runners)
            if not package.exported.manifest.get("dynamic_batch"):
                raise SquantError(f"{directory} holds a fixed-batch package")
            served = padded_for_serving(package, pad)
            with torch.no_grad():
                output = first_tensor(served(**check_inputs))
            cos = agreement(reference, output, check_inputs.get("attention_mask"))
        except (SquantError, RuntimeError, OSError) as e:
            warnings.warn(
                f"not serving from a cached package ({first_line(e)[:300]}); compiling instead",
                stacklevel=2,
            )
            return None
        if cos >= min_cosine:
            return served
        del package, served
        shutil.rmtree(directory, ignore_errors=True)  # a package that disagrees is not kept
    warnings.warn(
        f"this model's package disagrees with the eager model (cosine {cos:.5f} < "
        f"{min_cosine}); compiling instead",
        stacklevel=2,
    )
    return None


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """An exclusive lock on `directory` across processes (a lock file beside it)."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    with open(directory.with_name(directory.name + ".lock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build(model: nn.Module, directory: Path, tokenizer: Any, float_dtype: FloatDtype) -> None:
    from ..runtime.export import ExportConfig, export

    print(
        f"squant: building this model's package once into {directory} (later starts load it "
        "in seconds)",
        file=sys.stderr,
    )
    started = time.perf_counter()
    config = ExportConfig(
        batch=2, seq=16, dynamic_seq=True, dynamic_batch=True, float_dtype=float_dtype
    )
    export(model, directory, None, tokenizer, config, overwrite=True)
    print(f"squant: package built in {time.perf_counter() - started:.0f} s", file=sys.stderr)
