"""squant.compile: a quantized (or float) encoder turned into a fast, checked CPU executable.

- TorchInductor with freezing: weights become constants, the oneDNN-packed int8 weights are
  used as they are, and each activation-quantize step fuses into the kernel that produces its
  input (LayerNorm, GELU, ...). Inductor settings are patched around each call of the compiled
  model (dynamo reads `freezing` while tracing, which happens lazily at a call, and again for
  each new input shape), and restored after it: nothing global changes.
- The parts that stay floating point (embeddings, LayerNorm, attention, softmax) run in BF16
  where the CPU has native BF16 math (AVX512-BF16 or AMX) and the result still agrees with
  eager, in FP32 otherwise; int8 GEMMs are unaffected.
- The compiled model is checked against the eager model it came from on example inputs, and
  refused (SquantError) if the outputs disagree.
- Before each call dynamo checks only the call's arguments, global state and which model is
  calling, not the ~1,200 attributes of the frozen model (guards.py).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import threading
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal, cast, get_args

import torch
from torch import Tensor, nn

from ..errors import SquantError
from ..hardware import cpu_features
from ..quant.attention import (
    SQUANT_ATTENTION,
    FusedSelfAttention,
    key_padding_bias,
    register_squant_attention,
    uses_int8_attention,
)
from ..quant.mappings import hf_config
from ..quant.qlinear import QuantLinear
from ..quant.record import QuantizationRecord, record_of
from .fusion import INDUCTOR_OPTIONS as FUSION_OPTIONS
from .guards import keep_call_guards
from .outputs import first_tensor
from .timing import measure

# each choice once, as a Literal; its tuple (for checks and CLI choices) derived from it
FloatDtype = Literal["auto", "bf16", "fp32"]
FLOAT_DTYPES: tuple[FloatDtype, ...] = get_args(FloatDtype)
Attention = Literal["auto", "squant", "sdpa", "model"]
ATTENTIONS: tuple[Attention, ...] = get_args(Attention)
Gemm = Literal["onednn", "autotune", "auto"]
GEMMS: tuple[Gemm, ...] = get_args(Gemm)


@dataclass(frozen=True)
class CompileConfig:
    """How squant.compile builds the executable.

    float_dtype: dtype of the non-int8 parts; "auto" = fp32 for a squant INT8 model, and for
        a float model bf16 when the CPU has native BF16 and the BF16 model agrees with eager
        on example_inputs, fp32 otherwise.
    attention: "squant" (matmul-softmax-matmul, see attention.py), "sdpa" (PyTorch's fused
        kernel), "model" (whatever the model's config says) or "auto": both timed on the
        example inputs' shapes, the faster is used.
    gemm: "onednn" (squant's int8 kernels as they are), "autotune" (inductor times its CPP
        GEMM template against oneDNN per GEMM shape), or "auto": compile both, check each
        against eager, keep the faster whole model. A candidate whose outputs disagree with
        eager (cosine < min_cosine) is rejected with a warning: upstream, the CPP template
        gave wrong results on a VNNI-only CPU while looking faster per GEMM.
    dynamic: compile for varying sequence lengths (False: one specialization per shape).
    min_cosine: the compiled model's outputs must match the eager ones at least this well,
        or as well as eager matches itself when its input embeddings move by a few float32
        ulps, where that is lower (see noise_floor: on long inputs an int8 model's own output
        moves more than this under rounding-sized changes).
    """

    float_dtype: FloatDtype = "auto"
    attention: Attention = "auto"
    gemm: Gemm = "onednn"
    dynamic: bool = False
    min_cosine: float = 0.999
    kernel_profile: bool = False  # name inductor's kernels in profiler traces (hotspots)
    # inductor's C++ wrapper: the generated code calls the kernels from C++ (no Python
    # between them, and the call releases the GIL). Real all-MiniLM-L6-v2, bs 1 x 128, 2 AVX2
    # threads, 10 interleaved rounds beside the Python wrapper (benchmarks/speed.py,
    # squant-*-cpp-wrapper variants): median 4.6% faster static, 2.5% faster dynamic, 8 of 10
    # rounds in favour of each; it builds a few seconds longer. On by default.
    cpp_wrapper: bool = True

    def __post_init__(self) -> None:
        choices = {
            "float_dtype": FLOAT_DTYPES,
            "attention": ATTENTIONS,
            "gemm": GEMMS,
        }
        for field, allowed in choices.items():
            if getattr(self, field) not in allowed:
                raise SquantError(f"{field} must be one of {allowed}, got {getattr(self, field)!r}")
        if not 0.0 < self.min_cosine <= 1.0:
            raise SquantError(f"min_cosine must be in (0, 1], got {self.min_cosine}")

    def resolved_dtype(self, model: nn.Module | None = None) -> torch.dtype:
        """The float parts' dtype for `model` (None: a float model)."""
        if self.float_dtype == "fp32":
            return torch.float32
        if self.float_dtype == "bf16":
            if not cpu_features().native_bf16:
                warnings.warn(
                    "float_dtype='bf16' on a CPU without native BF16 (no AVX512-BF16/AMX): BF16 is "
                    "emulated there (distilbert BF16 compiled ran 6.5x slower than FP32 on an AVX2 "
                    "Zen 3) and a real-weight int8 model with BF16 parts did not finish one batch "
                    "in minutes; float_dtype='auto' picks FP32 here",
                    stacklevel=3,
                )
            return torch.bfloat16
        if model is not None and record_of(model) is not None:
            # An INT8 model's float parts are LayerNorm, residual adds, GELU and the
            # embeddings (its GEMMs and attention are int8): BF16 there bought no speed
            # (real all-MiniLM-L6-v2 1 x 128 on an AVX512-BF16 Zen 5, interleaved rounds
            # beside FP32 parts: static 0.94x, dynamic within noise), and its rounding moves
            # activations to the next int8 step, so the compile guard refused it on real
            # weights (cosine 0.998 vs eager) after compiling it for nothing.
            return torch.float32
        return torch.bfloat16 if cpu_features().native_bf16 else torch.float32


# inductor settings of each GEMM candidate; freezing makes weights constants (packed once)
GEMM_OPTIONS: dict[str, dict[str, Any]] = {
    "onednn": {"freezing": True, **FUSION_OPTIONS},
    "autotune": {
        "freezing": True,
        **FUSION_OPTIONS,
        "max_autotune": True,
        "max_autotune_gemm_backends": "CPP,ATEN",
    },
}


def cast_float_parts(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Cast every floating parameter/buffer to dtype except QuantLinear's scales, which the
    int8 GEMM needs in float32. In place; returns the model."""
    for module in model.modules():
        if isinstance(module, QuantLinear):
            continue
        for name, p in list(module.named_parameters(recurse=False)):
            if p.is_floating_point():
                setattr(module, name, nn.Parameter(p.detach().to(dtype), requires_grad=False))
        for name, b in list(module.named_buffers(recurse=False)):
            if b is not None and b.is_floating_point():
                module.register_buffer(
                    name, b.to(dtype), persistent=name not in module._non_persistent_buffers_set
                )
    return model


def _needs_float32(out: Any) -> bool:
    if isinstance(out, Tensor):
        return out.is_floating_point() and out.dtype != torch.float32
    if isinstance(out, Mapping):
        return any(_needs_float32(v) for v in out.values())
    if isinstance(out, tuple):
        return any(_needs_float32(v) for v in out)
    return False


def _to_float32(out: Any) -> Any:
    # an output already in float32 (FP32 float parts) is returned as it is: rebuilding a
    # transformers ModelOutput costs ~20 us a call
    if not _needs_float32(out):
        return out
    if isinstance(out, Tensor):
        return out.float() if out.is_floating_point() else out
    if isinstance(out, Mapping):  # transformers ModelOutput keeps its type
        return type(out)(**{k: _to_float32(v) for k, v in out.items()})
    if isinstance(out, tuple):
        return type(out)(_to_float32(v) for v in out)
    return out


class CompiledEncoder(nn.Module):
    """The compiled model; same call signature, float outputs returned as float32."""

    def __init__(
        self, model: nn.Module, config: CompileConfig, dtype: torch.dtype, gemm: str
    ) -> None:
        super().__init__()
        self.model = model
        self.compile_config = config
        self.float_dtype = dtype
        self.gemm = gemm
        self.options = dict(GEMM_OPTIONS[gemm])
        if config.kernel_profile:
            self.options["cpp.enable_kernel_profile"] = True
        if config.cpp_wrapper:
            self.options["cpp_wrapper"] = True
            # the wrapper (one long function calling every kernel) built apart from the kernels,
            # at -O1: one -O3 build of both took most of a big model's compile (bert-large
            # dynamic: 46 s of 104 s); real MiniLM ran at the same speed either way
            self.options["cpp_wrapper_build_separate"] = True
        # only guards on the call's arguments and global state: the model is frozen (guards.py)
        compile_options = {**self.options, "guard_filter_fn": keep_call_guards}
        self._compiled = torch.compile(model, dynamic=config.dynamic, options=compile_options)
        self.selection: dict[str, Any] = {}
        self.check_cosine: float | None = None
        self.sealed = False
        self.refused_recompiles = 0  # calls that would have compiled after seal(): ran eagerly

    @property
    def config(self) -> Any:
        return self.model.config

    @property
    def squant_info(self) -> QuantizationRecord | None:
        return record_of(self.model)

    def seal(self) -> None:
        """From now on, never compile: a call whose shapes no compiled graph covers runs the
        model eagerly (same outputs, slower) and is counted in `refused_recompiles`, instead
        of stalling its caller for the tens of seconds a compile takes. A server seals its
        model once every shape it will send is warm."""
        self.sealed = True

    @torch.no_grad()
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.sealed:
            # Twice before giving up: with two workers calling one model, dynamo now and then
            # fails a guard of a graph that covers the call and passes it on re-analysis
            # ("runtime guards failed even though they passed"): 4 of ~630 mixed requests
            # on real MiniLM, all at shapes warm-up had compiled.
            error: RuntimeError | None = None
            for _ in range(2):
                try:
                    with _no_compiling():
                        return _to_float32(self._compiled(*args, **kwargs))
                except RuntimeError as e:
                    if "fail_on_recompile" not in str(e):
                        raise
                    error = e
            with _COUNT_LOCK:
                self.refused_recompiles += 1
                first = self.refused_recompiles == 1
            if first:  # once: the counter in /metrics says how often
                shapes = {k: tuple(v.shape) for k, v in kwargs.items() if hasattr(v, "shape")}
                _LOG.warning("a call no compiled graph covers ran eagerly (%s): %s", shapes, error)
            return _to_float32(self.model(*args, **kwargs))
        # dynamo reads inductor's `freezing` while tracing (lazily, at a call): scope it here
        with torch._inductor.config.patch(self.options):
            return _to_float32(self._compiled(*args, **kwargs))

    def describe(self) -> dict[str, Any]:
        return {
            **asdict(self.compile_config),
            "resolved_float_dtype": str(self.float_dtype),
            "attention_used": hf_config(self.model)._attn_implementation,
            "gemm_used": self.gemm,
            "selection": self.selection,
            "check_cosine": self.check_cosine,
        }


# dynamo's "stance" is one process-wide setting: calls of sealed models on several threads
# share it, so it is set when the first such call starts and restored when the last ends
_COUNT_LOCK = threading.Lock()
_LOG = logging.getLogger("squant.compile")
_STANCE_LOCK = threading.Lock()
_sealed_calls = 0
_prior_stance: Any = None


@contextlib.contextmanager
def _no_compiling() -> Iterator[None]:
    """dynamo raises instead of compiling while any sealed model's call is running."""
    from torch._dynamo.eval_frame import DynamoStance, _set_stance

    global _sealed_calls, _prior_stance
    with _STANCE_LOCK:
        if _sealed_calls == 0:
            _prior_stance = _set_stance(DynamoStance("fail_on_recompile"))
        _sealed_calls += 1
    try:
        yield
    finally:
        with _STANCE_LOCK:
            _sealed_calls -= 1
            if _sealed_calls == 0:
                _set_stance(_prior_stance)


def _cosine(a: Tensor, b: Tensor) -> float:
    return float(nn.functional.cosine_similarity(a.flatten().float(), b.flatten().float(), 0))


def agreement(reference: Tensor, output: Tensor, attention_mask: Tensor | None) -> float:
    """Cosine of the compiled output vs eager over what a user reads: for per-token outputs
    ([batch, seq, ...]) only the real tokens. Padding positions hold values nobody uses (each
    attends only to real keys, but its own hidden state is arbitrary), and counting them let
    BF16 noise there refuse a model whose real outputs agree."""
    if (
        attention_mask is not None
        and reference.dim() >= 2
        and tuple(reference.shape[:2]) == tuple(attention_mask.shape)
    ):
        keep = attention_mask.bool()
        return _cosine(reference[keep], output[keep])
    return _cosine(reference, output)


# Relative change of the input embeddings noise_floor makes: ~8 float32 ulps, what a compiled
# graph's different float roundings amount to (compiled vs eager, one layer of real MiniLM:
# 1e-7 relative difference).
EMBEDDING_JITTER = 1e-6


def noise_floor(model: nn.Module, inputs: Mapping[str, Tensor], reference: Tensor) -> float:
    """How well the eager model agrees with itself (as `agreement` measures it) when its input
    embeddings are moved by EMBEDDING_JITTER: what float rounding alone does to its output.

    An int8 model's activations sit on quantization grids, and a rounding-sized change flips
    some of them: on real all-MiniLM-L6-v2 static INT8, a 1e-6 jitter moved eager's own output
    to cosine 0.9982 on a 512-token row and 0.9987 on a 16-token row of emoji and code, while
    short sentences stayed at 1.000000. A compiled model, whose float roundings differ from
    eager's everywhere, cannot be held closer to eager than that (it was refused at 0.99897
    on such a batch while as close to FP32 as eager). 1.0 for a model without input
    embeddings to move."""
    get_embeddings = getattr(model, "get_input_embeddings", None)
    embeddings = get_embeddings() if callable(get_embeddings) else None
    if not isinstance(embeddings, nn.Module):
        return 1.0
    generator = torch.Generator().manual_seed(0)

    def jitter(module: nn.Module, args: Any, output: Tensor) -> Tensor:
        noise = torch.randn(output.shape, generator=generator, dtype=torch.float32)
        return output * (1 + EMBEDDING_JITTER * noise).to(output.dtype)

    handle = embeddings.register_forward_hook(jitter)
    try:
        with torch.no_grad():
            jittered = first_tensor(model(**inputs))
    finally:
        handle.remove()
    return agreement(reference, jittered, inputs.get("attention_mask"))


def _time_attention(name: str, shape: tuple[int, int, int, int], dtype: torch.dtype) -> float:
    """Median ms of one compiled attention of the given implementation at [B, H, S, D]."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    register_squant_attention()
    b, h, s, d = shape
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, h, s, d, generator=g).to(dtype) for _ in range(3))
    keep = torch.ones(b, s, dtype=torch.long)
    if name == "squant":
        mask = key_padding_bias(b, s, s, keep, dtype=dtype)
    else:
        mask = keep.bool()[:, None, None, :].expand(b, 1, s, s)
    fn = ALL_ATTENTION_FUNCTIONS[name]
    module = cast(Any, nn.Module().eval())
    module.is_causal = False
    compiled = torch.compile(lambda q, k, v, m: fn(module, q, k, v, m, scaling=d**-0.5)[0])
    with torch.no_grad():
        return measure(lambda: compiled(q, k, v, mask), warmup=3, min_seconds=0.5).median_ms


def choose_attention(
    model: nn.Module, inputs: Mapping[str, Tensor], dtype: torch.dtype
) -> dict[str, float]:
    """Time squant's and PyTorch's attention at this model's shapes; returns ms per candidate."""
    batch, seq = inputs["input_ids"].shape[:2]
    heads = next(m for m in model.modules() if isinstance(m, FusedSelfAttention))
    shape = (batch, heads.num_heads, seq, heads.head_dim)
    return {name: _time_attention(name, shape, dtype) for name in (SQUANT_ATTENTION, "sdpa")}


def compile(  # the public name mirrors torch.compile
    model: nn.Module,
    config: CompileConfig | None = None,
    example_inputs: Mapping[str, Tensor] | None = None,
) -> CompiledEncoder:
    """Compile an encoder (squant-quantized or float) for CPU inference.

    example_inputs: a tokenizer output to compile and check with now (needed by the "auto"
    choices); without it compilation happens on the first call and is not checked.
    """
    config = config or CompileConfig()
    if example_inputs is None and config.gemm == "auto":
        raise SquantError("gemm='auto' measures candidates: pass example_inputs")
    dtype = config.resolved_dtype(model)
    if example_inputs is None:
        work, _ = _prepare(model, config, dtype, None)
        gemm = "onednn" if config.gemm == "auto" else config.gemm
        return CompiledEncoder(work, config, dtype, gemm)

    inputs = dict(example_inputs)
    with torch.no_grad():
        reference = first_tensor(model(**inputs))
    floor = noise_floor(model, inputs, reference)
    min_cosine = min(config.min_cosine, floor)
    # "auto" on a float model tries BF16 float parts first where the CPU computes BF16
    # natively, and falls back to FP32 ones when they disagree with eager. (INT8 models get
    # FP32 parts straight away, see resolved_dtype: on real all-MiniLM-L6-v2 static INT8 BF16
    # parts gave per-token cosine 0.9983-0.9986 against eager, FP32 parts 0.99999. Not one
    # op's fault: BF16 rounding at any single site moves an int8 model that far, while its
    # cosine vs FP32 stays the same, benchmarks/bf16_sites.py.) An explicit float_dtype="bf16"
    # on an INT8 model is checked as any compile is.
    dtypes = [dtype]
    if config.float_dtype == "auto" and dtype != torch.float32:
        dtypes.append(torch.float32)
    refused: dict[str, Any] = {}  # float dtypes tried first and refused, with what they gave
    for dtype in dtypes:
        work, attention_timings = _prepare(model, config, dtype, inputs)
        tried: dict[str, Any] = {"attention_ms": attention_timings} if attention_timings else {}
        best = _checked_candidates(work, config, dtype, inputs, reference, min_cosine, tried)
        if best is not None:
            break
        refused[_DTYPE_NAMES[dtype]] = tried
        if dtype != dtypes[-1]:
            warnings.warn(
                f"squant.compile: {_DTYPE_NAMES[dtype]} float parts disagree with eager "
                f"({_cosines(tried)}); compiling with FP32 float parts "
                "(float_dtype='fp32' skips the attempt)",
                stacklevel=2,
            )
    if best is None:
        raise SquantError(
            f"the compiled model disagrees with the eager one ({refused}); refusing it"
            + (". Try float_dtype='fp32'" if torch.float32 not in dtypes else "")
        )
    best.selection = {
        **tried,
        "noise_floor": floor,
        "min_cosine": min_cosine,
        **({"refused_float": refused} if refused else {}),
    }
    return best


_DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16"}


def _cosines(tried: Mapping[str, Any]) -> str:
    return ", ".join(
        f"{name} cosine {entry['cosine']:.5f}"
        for name, entry in tried.items()
        if name.startswith("gemm:")
    )


def _prepare(
    model: nn.Module, config: CompileConfig, dtype: torch.dtype, inputs: Mapping[str, Tensor] | None
) -> tuple[nn.Module, dict[str, float] | None]:
    """A copy of the model with its float parts in dtype and its attention chosen (timed on
    the inputs' shape when config.attention is "auto" and inputs are given)."""
    work = copy.deepcopy(model).eval()
    if dtype != torch.float32:
        cast_float_parts(work, dtype)
    attention: str = config.attention
    timings: dict[str, float] | None = None
    has_fused = any(isinstance(m, FusedSelfAttention) for m in work.modules())
    if uses_int8_attention(work):
        attention = "model"  # the quantized model's own choice, kept (see SmoothQuantConfig)
    if attention == "auto":
        if inputs is not None and has_fused:
            timings = choose_attention(work, inputs, dtype)
            attention = min(timings, key=timings.__getitem__)
        else:
            attention = SQUANT_ATTENTION if has_fused else "model"
    if attention != "model":
        register_squant_attention()
        hf_config(work)._attn_implementation = attention
    return work, timings


def _checked_candidates(
    work: nn.Module,
    config: CompileConfig,
    dtype: torch.dtype,
    inputs: Mapping[str, Tensor],
    reference: Tensor,
    min_cosine: float,
    selection: dict[str, Any],
) -> CompiledEncoder | None:
    """The fastest GEMM candidate whose outputs agree with eager (None if none does); what
    each gave is written into selection."""
    candidates = ["onednn", "autotune"] if config.gemm == "auto" else [config.gemm]
    best: CompiledEncoder | None = None
    for gemm in candidates:
        # one module per candidate: dynamo guards frozen weights by identity, so each copy
        # gets its own compiled code (no global cache reset needed)
        module = copy.deepcopy(work) if len(candidates) > 1 else work
        result = CompiledEncoder(module, config, dtype, gemm)
        cos = agreement(reference, first_tensor(result(**inputs)), inputs.get("attention_mask"))
        entry: dict[str, Any] = {"cosine": cos}
        if not cos >= min_cosine:
            entry["status"] = "rejected: disagrees with eager"
            warnings.warn(
                f"squant.compile: {gemm} kernels with {_DTYPE_NAMES[dtype]} float parts "
                f"disagree with eager (cosine {cos:.5f} < {min_cosine:.5f}); not used",
                stacklevel=3,
            )
        else:
            if len(candidates) > 1:
                run = functools.partial(result, **inputs)
                entry["ms"] = measure(run, min_seconds=1.0).median_ms
            entry["status"] = "ok"
            if best is None or entry.get("ms", 0.0) < selection[f"gemm:{best.gemm}"]["ms"]:
                best = result
                best.check_cosine = cos
        selection[f"gemm:{gemm}"] = entry
    return best
