"""SmoothQuant math as pure tensor functions (no modules, no hooks).

For a linear y = x Wᵀ with input channels j, any s > 0 gives y = (x / s)(W · s)ᵀ exactly.
SmoothQuant picks s_j = max|X_j|^α / max|W_j|^(1-α) so that activation outlier channels
shrink and the weights' columns absorb them, balancing the int8 error of both sides.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from . import int8

# Keep s in a range where x/s and W*s stay well inside float32 and int8 rounding stays sane.
S_MIN, S_MAX = 1e-4, 1e4


def weight_channel_absmax(*weights: Tensor) -> Tensor:
    """max |W[:, j]| over the output rows of all given [out, in] weights -> [in]."""
    return torch.stack([w.detach().abs().amax(dim=0) for w in weights]).amax(dim=0).float()


def smoothing_factors(
    act_absmax: Tensor, weight_absmax: Tensor, alpha: float, eps: float = 1e-5
) -> Tensor:
    """Per-input-channel smoothing vector s ([in], float32, all > 0).

    act_absmax, weight_absmax: [in] per-channel max magnitudes of the activation and of the
    weight column(s) that read it. alpha=0 means no smoothing (s = 1, plain W8A8); channels
    that are never active or have all-zero weights keep s = 1.
    """
    if act_absmax.shape != weight_absmax.shape or act_absmax.dim() != 1:
        raise ValueError(
            f"expected two [in] vectors, got {tuple(act_absmax.shape)} and "
            f"{tuple(weight_absmax.shape)}"
        )
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    a = act_absmax.float()
    w = weight_absmax.float()
    if alpha == 0.0:
        return torch.ones_like(a)
    s = a.clamp(min=eps).pow(alpha) / w.clamp(min=eps).pow(1.0 - alpha)
    s = torch.where((a > 0) & (w > 0), s, torch.ones_like(s))
    return s.clamp(S_MIN, S_MAX)


# alpha candidates of the per-layer search: 0 (no smoothing) to 1 in steps of 0.05, visited
# coarse to fine: the quarter points first, then 0.05 steps within 0.15 of the best of those.
ALPHA_GRID: tuple[float, ...] = tuple(round(0.05 * i, 2) for i in range(21))
COARSE_GRID: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
REFINE_RADIUS = 0.15


def _deployed_gemm(weight: Tensor, s: Tensor) -> Callable[[Tensor, float, int], Tensor]:
    """(x_q, x_scale, x_zero_point) -> float32 x·(W·s)ᵀ, W·s quantized as a QuantLinear's
    weight (int8.quantize_weight), on the GEMM that QuantLinear runs. For squant's GEMM the
    weight is quantized straight into its packed layout in one pass (squant::
    quantize_weight_blocked, the same numbers): five tensor passes and a permuting copy took
    ~20 ms per candidate on a 4096 x 1024 weight, most of BERT-large's alpha search."""
    if int8.gemm_kernel(weight.shape[1]) == "squant":
        packed, compensation, w_scale = torch.ops.squant.quantize_weight_blocked(
            weight, s, int8.kernel_weight_qmax()
        )
        return lambda x_q, scale, zp: int8.squant_linear(
            x_q, scale, zp, packed, compensation, w_scale, None, torch.float32
        )
    w_q, w_scale = int8.quantize_weight(weight * s[None, :])
    onednn_packed = int8.pack_weight(w_q)
    w_zp = torch.zeros(w_q.shape[0], dtype=torch.int32)
    return lambda x_q, scale, zp: int8.int8_linear(
        x_q, scale, zp, onednn_packed, w_scale, w_zp, None, torch.float32
    )


def int8_output_error(
    x: Tensor,
    weight: Tensor,
    s: Tensor,
    mode: str,
    act_range: tuple[float, float] | None = None,
    reference: Tensor | None = None,
) -> float:
    """Mean squared error of the int8 GEMM on x' = x / s with weight W·s against x Wᵀ.

    Runs the u8 x s8 GEMM the model will (int8.gemm_kernel: squant's or oneDNN's; exact
    integer accumulation, 4x the throughput of a float emulation). x: [tokens, in] sample of
    the layer's input; weight: [out, in]. Static mode quantizes x' on the per-tensor grid of
    act_range (the calibrated range of x'); dynamic per token. reference: x Wᵀ, when the
    caller has it already.
    """
    gemm = _deployed_gemm(weight, s)
    if mode == "static":
        if act_range is None:
            raise ValueError("static mode needs act_range")
        scale, zp = int8.affine_qparams(*act_range)
        y = gemm(int8.quantize_static(x, 1.0 / (s * scale), zp), scale, zp)
    else:
        x_q, token_scale = int8.quantize_per_token(x * (1.0 / s))
        y = gemm(x_q, 1.0, int8.SYMMETRIC_ZP) * token_scale
    ref = x @ weight.T if reference is None else reference
    return float((y - ref).pow(2).mean())


def search_alpha(
    x: Tensor,
    weight: Tensor,
    act_min: Tensor,
    act_max: Tensor,
    mode: str,
    grid: tuple[float, ...] = ALPHA_GRID,
    exhaustive: bool = False,
) -> tuple[float, dict[float, float]]:
    """The alpha in `grid` whose smoothing gives the smallest int8 output error on x.

    The error is U-shaped in alpha (too little smoothing: activation outliers; too much:
    weight outliers), so by default the grid is searched coarse to fine (about 11 of its 21
    points); exhaustive=True tries every point.
    act_min/act_max: [in] calibrated per-channel range of the input (all tokens, not just the
    sample), from which each candidate's static range is derived exactly.
    Returns (best alpha, {alpha: mse} of the points tried).
    """
    weight = weight.detach().float()
    act_absmax = torch.maximum(act_min.abs(), act_max.abs())
    w_absmax = weight_channel_absmax(weight)
    reference = x @ weight.T
    errors: dict[float, float] = {}

    def visit(points: tuple[float, ...]) -> None:
        for alpha in points:
            if alpha in errors:
                continue
            s = smoothing_factors(act_absmax, w_absmax, alpha)
            rng = (float((act_min / s).min()), float((act_max / s).max()))
            errors[alpha] = int8_output_error(x, weight, s, mode, rng, reference)

    if exhaustive:
        visit(grid)
    else:
        visit(tuple(a for a in COARSE_GRID if a in grid) or grid)
        center = min(errors, key=errors.__getitem__)
        visit(tuple(a for a in grid if abs(a - center) <= REFINE_RADIUS + 1e-9))
    best = min(errors, key=errors.__getitem__)
    return best, errors
