"""SmoothQuant math as pure tensor functions (no modules, no hooks).

For a linear y = x Wᵀ with input channels j, any s > 0 gives y = (x / s)(W · s)ᵀ exactly.
SmoothQuant picks s_j = max|X_j|^α / max|W_j|^(1-α) so that activation outlier channels
shrink and the weights' columns absorb them, balancing the int8 error of both sides.
"""

from __future__ import annotations

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


# alpha candidates of the per-layer search: 0 (no smoothing) to 1 in steps of 0.05.
ALPHA_GRID: tuple[float, ...] = tuple(round(0.05 * i, 2) for i in range(21))


def int8_output_error(
    x: Tensor,
    weight: Tensor,
    s: Tensor,
    mode: str,
    act_range: tuple[float, float] | None = None,
) -> float:
    """Mean squared error of the int8 GEMM on x' = x / s against x' (W·s)ᵀ (= x Wᵀ).

    x: [tokens, in] sample of the layer's input; weight: [out, in]. Static mode quantizes x'
    on the per-tensor grid of act_range (the calibrated range of x'); dynamic per token.
    """
    xs = x * (1.0 / s)
    ws = weight * s[None, :]
    w_q, w_scale = int8.quantize_weight(ws)
    w_deq = w_q.float() * w_scale[:, None]
    if mode == "static":
        if act_range is None:
            raise ValueError("static mode needs act_range")
        scale, zp = int8.affine_qparams(*act_range)
        x_q = torch.clamp(torch.round(xs / scale) + zp, int8.QMIN_A, int8.QMAX_A)
        x_deq = (x_q - zp) * scale
    else:
        x_q, scale = int8.quantize_per_token(xs)
        x_deq = (x_q.float() - int8.SYMMETRIC_ZP) * scale
    return float((x_deq @ w_deq.T - xs @ ws.T).pow(2).mean())


def search_alpha(
    x: Tensor,
    weight: Tensor,
    act_min: Tensor,
    act_max: Tensor,
    mode: str,
    grid: tuple[float, ...] = ALPHA_GRID,
) -> tuple[float, dict[float, float]]:
    """The alpha in `grid` whose smoothing gives the smallest int8 output error on x.

    act_min/act_max: [in] calibrated per-channel range of the input (all tokens, not just the
    sample), from which each candidate's static range is derived exactly.
    Returns (best alpha, {alpha: mse}).
    """
    weight = weight.detach().float()
    act_absmax = torch.maximum(act_min.abs(), act_max.abs())
    w_absmax = weight_channel_absmax(weight)
    errors = {}
    for alpha in grid:
        s = smoothing_factors(act_absmax, w_absmax, alpha)
        rng = (float((act_min / s).min()), float((act_max / s).max()))
        errors[alpha] = int8_output_error(x, weight, s, mode, rng)
    best = min(grid, key=errors.__getitem__)
    return best, errors
