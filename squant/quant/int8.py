"""INT8 arithmetic and the GEMM kernels it runs on (squant's own, else oneDNN's).

Conventions (every int8 tensor in squant follows them):
- weights: symmetric per output channel, int8 in [-127, 127], w ≈ w_q * w_scale[:, None];
  [-63, 63] (7 bits) where the CPU has no VNNI (see kernel_weight_qmax).
- activations: uint8 with a zero point, x ≈ (x_q - zp) * x_scale. Symmetric int8 activations
  are stored shifted by 128 (zp = 128): on CPUs whose VNNI multiplies only u8 by s8, oneDNN
  runs s8 x s8 through a reference kernel thousands of times slower, while u8 x s8 with a zero
  point runs brgemm (oneDNN folds zp * colsum(W) into the accumulator).
"""

from __future__ import annotations

import functools
import os
import warnings
from typing import cast

import torch
from torch import Tensor

QMIN_W, QMAX_W = -127, 127
QMAX_W_NO_VNNI = 63  # 7-bit weights: u8 x s8 pair sums stay inside int16 (2·255·63 < 2¹⁵)
QMIN_A, QMAX_A = 0, 255
SYMMETRIC_ZP = 128  # u8 zero point that makes a symmetric int8 grid
_TINY = 1e-12


@functools.cache
def kernel_weight_qmax() -> int:
    """Largest |weight| the host's u8 x s8 GEMM multiplies exactly.

    Without VNNI (AVX2, AVX512 before Cascade Lake), oneDNN multiplies u8 by s8 with
    vpmaddubsw, which adds two u8·s8 products into a *saturating* int16: 2·255·127 = 64770
    overflows it, and the GEMM silently returns wrong sums (measured on an AVX2 Zen 3: errors
    of 8e4 on a 256-deep dot product with 8-bit weights, none with 7-bit ones). With weights in
    [-63, 63] no pair can overflow. VNNI (vpdpbusd) and AMX accumulate in int32: full 8 bits.
    """
    from ..hardware import cpu_features

    return QMAX_W if cpu_features().int8_path != "no-vnni" else QMAX_W_NO_VNNI


def quantize_weight(w: Tensor, qmax: int | None = None) -> tuple[Tensor, Tensor]:
    """[out, in] float -> (int8 [out, in], float32 scale [out]); symmetric per output row, in
    [-qmax, qmax] (default: what this host's kernel multiplies exactly)."""
    qmax = kernel_weight_qmax() if qmax is None else qmax
    w = w.detach().float()
    # |max| from one min/max pass, rounding and clamping in place: the same numbers as
    # abs().amax() and out-of-place ops, in 0.38x the time on a 4096 x 1024 weight (2 threads,
    # AMX Xeon); where oneDNN's GEMM runs, the alpha search quantizes each weight ~6-11 times
    low, high = torch.aminmax(w, dim=1)
    scale = (torch.maximum(high, -low) / qmax).clamp(min=_TINY)
    q = torch.div(w, scale[:, None]).round_().clamp_(-qmax, qmax).to(torch.int8)
    return q, scale


def kernel_weight(w_q: Tensor, scale: Tensor, qmax: int | None = None) -> tuple[Tensor, Tensor]:
    """The (int8 weight, scale) this host's kernel can run exactly: w_q itself when it fits in
    [-qmax, qmax]; otherwise the rows that do not fit requantized to that range (a model saved
    on a VNNI machine, loaded on one without). Never returns a weight the kernel would
    saturate on."""
    qmax = kernel_weight_qmax() if qmax is None else qmax
    row_max = w_q.abs().amax(dim=1).to(torch.int32)
    if int(row_max.max()) <= qmax:
        return w_q, scale
    factor = torch.where(row_max > qmax, qmax / row_max.clamp(min=1).float(), 1.0)
    w_k = torch.round(w_q.float() * factor[:, None]).clamp(-qmax, qmax).to(torch.int8)
    return w_k, (scale / factor).float()


def affine_qparams(lo: float, hi: float) -> tuple[float, int]:
    """(scale, zero_point) of the uint8 grid covering [lo, hi] (always widened to include 0)."""
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    scale = max((hi - lo) / (QMAX_A - QMIN_A), _TINY)
    zero_point = int(min(max(round(-lo / scale), QMIN_A), QMAX_A))
    return scale, zero_point


def quantize_static(x: Tensor, multiplier: Tensor, zero_point: int) -> Tensor:
    """uint8 = clamp(round(x * multiplier) + zp), in float32 whatever x's dtype; multiplier
    [in] folds the smoothing 1/s and 1/scale into one multiply per element.

    Zero is always on the grid (an integer zp): the many exact zeros and near-zeros of
    post-GELU activations quantize without error, so no systematic offset accumulates."""
    y = torch.round(x.float() * multiplier) + zero_point
    return y.clamp(QMIN_A, QMAX_A).to(torch.uint8)


def quantize_per_token(x: Tensor) -> tuple[Tensor, Tensor]:
    """[T, in] float -> (uint8 [T, in] with zp 128, float32 scale [T, 1]); symmetric per row."""
    scale = (x.abs().amax(dim=-1, keepdim=True).float() / QMAX_W).clamp(min=_TINY)
    # times the reciprocal (one division per row), as squant's kernel computes it
    q = torch.round(x * (1.0 / scale)).clamp(QMIN_W, QMAX_W) + SYMMETRIC_ZP
    return q.to(torch.uint8), scale


def quantize_rows(
    x: Tensor, multiplier: Tensor | None, side_index: Tensor | None
) -> tuple[Tensor, Tensor, Tensor]:
    """quantize_per_token(x · multiplier) in one kernel call, plus x[:, side_index] in float32
    ([T, 0] without side_index): the same integers and scales, each row read while in cache."""
    if x.dtype not in (torch.float32, torch.bfloat16):
        x = x.float()
    if multiplier is not None:
        multiplier = multiplier.float()
    return cast(
        tuple[Tensor, Tensor, Tensor],
        torch.ops.squant.quantize_per_token(x, multiplier, side_index),
    )


def pack_weight(w_q: Tensor) -> Tensor:
    """oneDNN's blocked layout of an int8 [out, in] weight (an opaque mkldnn tensor)."""
    return torch.ops.onednn.qlinear_prepack(w_q, None)


_PREPACK_TRACEABLE = False


def make_prepack_traceable() -> None:
    """Give onednn::qlinear_prepack a fake (shape-only) kernel so torch.export can trace it.

    PyTorch has none: inductor inserts the op itself, after tracing. squant's exported graphs
    call it on the frozen int8 weight; AOTInductor then folds it into an oneDNN-packed
    constant, exactly as its own quantization pass does. Registered once, on first export.
    """
    global _PREPACK_TRACEABLE
    if _PREPACK_TRACEABLE or torch._C._dispatch_has_kernel_for_dispatch_key(
        "onednn::qlinear_prepack", "Meta"
    ):
        _PREPACK_TRACEABLE = True
        return

    @torch.library.register_fake("onednn::qlinear_prepack")
    def _fake_prepack(weight: Tensor, x_shape: list[int] | None) -> Tensor:
        return weight.new_empty((weight.shape[1], weight.shape[0]))  # packed shape: [in, out]

    _PREPACK_TRACEABLE = True


# activation name -> (oneDNN post-op, algorithm) applied in the GEMM epilogue
POST_OPS: dict[str, tuple[str, str]] = {
    "none": ("none", ""),
    "gelu": ("gelu", "none"),
    "gelu_tanh": ("gelu", "tanh"),
    "relu": ("relu", ""),
}


def apply_activation(y: Tensor, activation: str) -> Tensor:
    """The same activations as POST_OPS, in plain PyTorch (for paths that cannot fuse them)."""
    if activation == "gelu":
        return torch.nn.functional.gelu(y)
    if activation == "gelu_tanh":
        return torch.nn.functional.gelu(y, approximate="tanh")
    if activation == "relu":
        return torch.relu(y)
    return y


def stored(y: Tensor) -> Tensor:
    """y as it is, but computed once and kept in memory under torch.compile.

    Inductor recomputes a cheap-looking pointwise result in every kernel that reads it. The
    dynamic FFN-in output (per-token scale, bias, outlier channels, exact GELU) is read by
    the FFN-out input's per-token absmax, its quantization and its outlier channels, so each
    element's erf ran twice in one kernel and again in the next one: on real
    all-MiniLM-L6-v2 at 8 x 128 that kernel took 4.2 ms per layer on one thread, against
    0.76 ms for static's (GELU inside oneDNN's GEMM). Stored, the whole dynamic model ran
    1.15x faster at 8 x 128 and 1.18x at 1 x 128 (2 threads, AVX512-VNNI Zen 5, interleaved
    rounds); the values are the same. A no-op in eager mode."""
    if not torch.compiler.is_compiling():
        return y
    return torch.ops.prims.inductor_force_stride_order(y, y.stride())


def int8_linear(
    x_q: Tensor,
    x_scale: float,
    x_zero_point: int,
    packed_weight: Tensor,
    w_scale: Tensor,
    w_zero_point: Tensor,
    bias: Tensor | None,
    out_dtype: torch.dtype,
    activation: str = "none",
) -> Tensor:
    """u8 [T, in] x s8 packed [out, in] -> out_dtype [T, out], with dequant scale, bias and
    the activation applied inside the GEMM: y = act(x_scale·w_scale[o]·Σ(x_q - zp)·w_q + b[o])."""
    post_op, algorithm = POST_OPS[activation]
    return torch.ops.onednn.qlinear_pointwise(
        x_q,
        x_scale,
        x_zero_point,
        packed_weight,
        w_scale,
        w_zero_point,
        bias,
        1.0,
        0,
        out_dtype,
        post_op,
        [],
        algorithm,
    )


GEMM_BLOCK_N = 64  # output columns per block of squant's packed weight (kernels/int8_linear.cpp)
GEMM_KERNELS = ("squant", "onednn")
GEMM_ENV = "SQUANT_INT8_GEMM"


@functools.cache
def _squant_gemm_runs() -> bool:
    """Whether squant's int8 GEMM runs here: its library builds or loads (needs a C++ compiler
    the first time) and PyTorch's brgemm multiplies u8 by s8 exactly on this CPU."""
    from .. import kernels
    from ..errors import SquantError

    try:
        kernels.load()
    except SquantError as e:
        warnings.warn(f"squant's int8 GEMM is unavailable ({e}); using oneDNN's", stacklevel=3)
        return False
    return bool(torch.ops.squant.int8_linear_supported())


def gemm_kernel(in_features: int) -> str:
    """Which GEMM a QuantLinear with this many inputs runs: "squant" (kernels/int8_linear.cpp)
    where it runs and in_features is a multiple of 4 (its packed layout), else "onednn".
    $SQUANT_INT8_GEMM=onednn forces oneDNN's (to compare the two, or to rule ours out)."""
    forced = os.environ.get(GEMM_ENV, "")
    if forced and forced not in GEMM_KERNELS:
        from ..errors import SquantError

        raise SquantError(f"${GEMM_ENV} must be one of {GEMM_KERNELS}, got {forced!r}")
    if forced == "onednn" or in_features % 4:
        return "onednn"
    return "squant" if _squant_gemm_runs() else "onednn"


def pack_weight_blocked(w_q: Tensor) -> tuple[Tensor, Tensor]:
    """squant's GEMM layout of an int8 [out, in] weight: [out/64, in/4, 64, 4] (4 consecutive
    inputs of one output next to each other, as the dot-product instruction reads them; out
    padded to a multiple of 64 with zero rows), and its int32 row sums (the zero-point
    compensation, one per padded output)."""
    out_features, in_features = w_q.shape
    padded = -(-out_features // GEMM_BLOCK_N) * GEMM_BLOCK_N
    w = torch.zeros(padded, in_features, dtype=torch.int8)
    w[:out_features] = w_q
    blocks = w.view(padded // GEMM_BLOCK_N, GEMM_BLOCK_N, in_features // 4, 4)
    return blocks.permute(0, 2, 1, 3).contiguous(), w.sum(dim=1, dtype=torch.int32)


def squant_linear(
    x_q: Tensor,
    x_scale: float,
    x_zero_point: int,
    packed_weight: Tensor,
    compensation: Tensor,
    w_scale: Tensor,
    bias: Tensor | None,
    out_dtype: torch.dtype,
    activation: str = "none",
    row_scale: Tensor | None = None,
    side_x: Tensor | None = None,
    side_w: Tensor | None = None,
) -> Tensor:
    """int8_linear on squant's kernel, from pack_weight_blocked's layout; its epilogue can
    also apply a scale per row (row_scale [T], the per-token scale of dynamic inputs) and add
    a float side product side_x [T, k] · side_w [k, out] (outlier channels), both before the
    activation."""
    return torch.ops.squant.int8_linear(
        x_q,
        packed_weight,
        compensation,
        x_scale,
        x_zero_point,
        w_scale,
        bias,
        w_scale.numel(),
        activation,
        out_dtype,
        row_scale,
        side_x,
        side_w,
    )


def onednn_available() -> bool:
    return bool(torch.backends.mkldnn.is_available())  # type: ignore[no-untyped-call]
