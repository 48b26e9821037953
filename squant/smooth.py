"""SmoothQuant math as pure tensor functions (no modules, no hooks).

For a linear y = x Wᵀ with input channels j, any s > 0 gives y = (x / s)(W · s)ᵀ exactly.
SmoothQuant picks s_j = max|X_j|^α / max|W_j|^(1-α) so that activation outlier channels
shrink and the weights' columns absorb them, balancing the int8 error of both sides.
"""

from __future__ import annotations

import torch
from torch import Tensor

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
