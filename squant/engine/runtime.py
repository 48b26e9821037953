"""What runs a served model's batches: the model eagerly, its AOTInductor package (built once
per model directory and cached: engine/package_cache.py), or squant.compile's executable with
dynamic shapes (one graph for every length bucket and batch size, and one for batch 1, which
dynamo specializes apart). Shared by `squant serve`, `squant embed` and their Ray forms.
"auto" serves a squant-quantized directory from its cached package (compiling when no package
can be built), a model quantized at start-up compiled, and a float checkpoint eagerly.

Bulk embedding compiles squant-quantized models by default ("auto"): on real
all-MiniLM-L6-v2 static INT8, one AVX2 core, the compiled model ran 1.22-1.44x the eager one
at batch 1-8 x 32-64 tokens and 1.8x at 16 x 128, and one dynamic graph ran as fast as graphs
compiled per shape. Serving does too: on an AVX512-VNNI core the compiled server answered
1.27x the eager one's requests/s at peak and 1.9x in a 3x overload burst, and was back to its
pre-burst p99 within 2 s (docs/serving.md; the "no recovery" measured before was the load
generator's HTTP client). Float checkpoints stay eager under "auto" (compiling FP32 gained
1.03x here).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Literal, get_args

import torch
from torch import nn

from ..errors import SquantError, first_line
from ..quant.mappings import model_inputs
from ..quant.record import record_of
from ..runtime.compiler import Attention

Runtime = Literal["auto", "eager", "compiled", "package"]
RUNTIMES: tuple[Runtime, ...] = get_args(Runtime)

# the compile check's inputs: a padded batch of real text (a compile that agreed on full
# random batches was refused on real weights with padded ones), one of
# them long enough that the attention choice is timed at a served width, not at 10 tokens
_CHECK_TEXTS = (
    "a man is playing a guitar on the street.",
    "a dog runs.",
    " ".join(["the quick brown fox jumps over the lazy dog near the river bank."] * 4),
    "",
)


def wants_compiled(runtime: Runtime, model: nn.Module, watch_ranges: bool) -> bool:
    """Whether this model is served compiled (or packaged): always for "compiled" and
    "package", never for "eager"; for "auto" when squant quantized it (and no range watch needs
    the eager modules)."""
    if runtime == "eager":
        return False
    if watch_ranges:
        if runtime in ("compiled", "package"):
            raise SquantError(
                "--watch-ranges counts in the eager model's modules: use --runtime eager"
            )
        return False
    return runtime in ("compiled", "package") or record_of(model) is not None


def check_inputs(model: nn.Module, tokenizer: Any) -> dict[str, torch.Tensor]:
    """The inputs a compiled or packaged model is checked against eager on."""
    return model_inputs(model, tokenizer(list(_CHECK_TEXTS), padding=True, return_tensors="pt"))


def packaged_model(
    model_dir: Path, model: nn.Module, tokenizer: Any, threads: int, instances: int, required: bool
) -> nn.Module | None:
    """The quantized directory's model as its cached package (engine/package_cache.py), run by
    `instances` threads of `threads` cores each; None when that failed and is not `required`
    (a warning says why); a SquantError when it is."""
    from .package_cache import cached_package

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with warnings.catch_warnings(record=required) as caught:
            served = cached_package(
                model_dir, model, tokenizer, instances, check_inputs(model, tokenizer)
            )
    finally:
        torch.set_num_threads(previous)
    if served is None and required:
        why = str(caught[-1].message) if caught else "no package"
        raise SquantError(f"--runtime package: {why}")
    return served


def compiled_runner(
    model: nn.Module, tokenizer: Any, threads: int, required: bool, attention: Attention = "auto"
) -> tuple[nn.Module, Any] | None:
    """(the model the runner wraps, the runner) compiled at `threads` threads, the workers'
    count (dynamo guards the thread count: a graph built at another count is rebuilt under
    traffic). attention: CompileConfig's; "auto" times the candidates in this process, so two
    processes (replicas, actors) may pick differently and agree only to cosine ~0.999. None when
    compiling failed and is not `required` (a warning says why: the
    server then runs eagerly); a SquantError when it is required."""
    from ..runtime.compiler import CompileConfig
    from ..runtime.compiler import compile as squant_compile

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        # the C++ wrapper: its model call releases the GIL for the whole forward. With the
        # Python wrapper each inductor kernel is a Python extension call that keeps the GIL
        # while it computes: a Python thread on another core ran at 0.62-0.72x its speed
        # beside it (eager: 0.92-1.28x; C++ wrapper: 0.88-0.89x), at the same model speed.
        # (It did not cure the slow recovery after an overload burst: that happened with
        # either wrapper, docs/serving.md.)
        config = CompileConfig(dynamic=True, cpp_wrapper=True, attention=attention)
        compiled = squant_compile(model, config, example_inputs=check_inputs(model, tokenizer))
    except Exception as e:  # inductor can fail in many ways (a C++ compiler missing, ...)
        reason = f"{type(e).__name__}: {first_line(e)}"[:300]
        if required:
            raise SquantError(f"--runtime compiled: compiling the model failed ({reason})") from e
        warnings.warn(f"serving eagerly: compiling the model failed ({reason})", stacklevel=2)
        return None
    finally:
        torch.set_num_threads(previous)
    return compiled.model, compiled
