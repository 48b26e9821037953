"""QuantLinear: a drop-in nn.Linear with int8 weights and int8 (u8) activations.

Buffers (all saved; the packed weight the GEMM reads is derived and never saved):
    weight            int8 [out, in]    W·s quantized per output row
    weight_scale      f32  [out]
    bias              f32  [out] or absent
    input_multiplier  f32  [in]         1/s, the SmoothQuant pre-scale of the input
    input_scale       f32  []           static only: scale of the smoothed input's u8 grid
    input_zero_point  i32  []           static only
    outlier_index     i64  [k]          optional: input channels multiplied in float32 beside
    outlier_weight    f32  [out, k]     the GEMM (their multiplier and int8 weight column are 0)

static:  x_q = clamp(round(x · (1/s) / input_scale) + zp)     one multiplier per channel
dynamic: x' = x · (1/s);  x_q = round(x' / scale_t) + 128     scale_t = max|x'_t| / 127
Both then run one u8×s8 GEMM. On squant's kernel (kernels/int8_linear.cpp, where it runs:
int8.gemm_kernel) its epilogue does everything after the integer sums: dequant scale, the
per-token scale (dynamic), bias, the outlier channels' share y += x[:, outlier_index] ·
outlier_weightᵀ (float32) and the activation. On oneDNN's qlinear the dequant scale and
(static) bias run inside it, and the rest in elementwise code after it.
Under torch.compile the quantize step fuses into the preceding kernel (LayerNorm, GELU, ...).
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import Tensor, nn

from . import int8
from .config import MODES


def _refresh_after_load(module: QuantLinear, _incompatible_keys: object) -> None:
    module.refresh()


class SmoothedLinear(nn.Linear):
    """A float linear that applies SmoothQuant exactly: y = (x · m) W'ᵀ + b, with m = 1/s and
    W' = W · s. Same output as the original up to float rounding; the inputs it sees (x · m)
    are what the int8 version will quantize.

    outliers: input channels taken out of that product (m = 0 and W' = 0 there) and applied
    from the unscaled input instead, y += x[:, outliers] · W[:, outliers]ᵀ: still exact."""

    input_multiplier: Tensor
    outlier_index: Tensor | None
    outlier_weight: Tensor | None

    @classmethod
    def from_linear(
        cls, linear: nn.Linear, smoothing: Tensor, outliers: Tensor | None = None
    ) -> SmoothedLinear:
        new = cls(linear.in_features, linear.out_features, linear.bias is not None)
        multiplier = (1.0 / smoothing).float()
        with torch.no_grad():
            new.weight.copy_(linear.weight.float() * smoothing[None, :])
            if linear.bias is not None:
                new.bias.copy_(linear.bias)
            side = None
            if outliers is not None and outliers.numel():
                outliers = outliers.to(torch.long)
                side = linear.weight.detach().float()[:, outliers].clone()
                new.weight[:, outliers] = 0.0
                multiplier[outliers] = 0.0
        new.register_buffer("input_multiplier", multiplier)
        new.register_buffer("outlier_index", None if side is None else outliers)
        new.register_buffer("outlier_weight", side)
        return new

    def forward(self, x: Tensor) -> Tensor:
        y = nn.functional.linear(x * self.input_multiplier, self.weight, self.bias)
        return add_outliers(y, x, self.outlier_index, self.outlier_weight)


def add_outliers(y: Tensor, x: Tensor, index: Tensor | None, weight: Tensor | None) -> Tensor:
    """y + x[..., index] · weightᵀ in float32 (the outlier channels' share of the product), or
    y unchanged when there are none."""
    if index is None or weight is None:
        return y
    xs = x.index_select(-1, index).float()
    if not torch.compiler.is_compiling():
        return y.float() + xs @ weight.T
    # Compiled: a k-term sum broadcast over the output channels instead of a [T, k] x [k, out]
    # GEMM, so inductor fuses it into the elementwise kernel that reads y anyway (a GEMM
    # writes and reads back a whole [T, out] tensor per linear).
    # The weight goes in as a contiguous [k, out] (freezing folds the copy into a constant), so
    # the sum runs along the output channels like the kernel it joins; from [out, k] inductor
    # vectorized over tokens instead, with strided gathers and two tile transposes per block
    # (the LayerNorm kernel it joined took 3x as long).
    return y.float() + (xs.unsqueeze(-1) * weight.t().contiguous()).sum(-2)


class QuantLinear(nn.Module):
    # buffers (registered in __init__ / refresh), declared for the type checker
    weight: Tensor
    weight_scale: Tensor
    bias: Tensor | None
    input_multiplier: Tensor
    input_scale: Tensor
    input_zero_point: Tensor
    kernel_weight: Tensor | None
    outlier_index: Tensor | None
    outlier_weight: Tensor | None
    kernel_scale: Tensor | None
    packed_weight: Tensor
    weight_compensation: Tensor | None
    weight_zero_point: Tensor
    _static_multiplier: Tensor

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool,
        mode: str,
        activation: str = "none",
        outliers: int = 0,
    ) -> None:
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if activation not in int8.POST_OPS:
            raise ValueError(
                f"activation must be one of {tuple(int8.POST_OPS)}, got {activation!r}"
            )
        self.in_features = in_features
        self.out_features = out_features
        self.mode = mode
        # applied to the output: inside the GEMM (static), or right after it (dynamic, where the
        # per-token scale must come first)
        self.activation = activation
        self.register_buffer("weight", torch.zeros(out_features, in_features, dtype=torch.int8))
        self.register_buffer("weight_scale", torch.ones(out_features))
        self.register_buffer("bias", torch.zeros(out_features) if bias else None)
        self.register_buffer("input_multiplier", torch.ones(in_features))
        self.register_buffer(
            "outlier_index", torch.zeros(outliers, dtype=torch.long) if outliers else None
        )
        self.register_buffer(
            "outlier_weight", torch.zeros(out_features, outliers) if outliers else None
        )
        if mode == "static":
            self.register_buffer("input_scale", torch.tensor(1.0))
            self.register_buffer(
                "input_zero_point", torch.tensor(int8.SYMMETRIC_ZP, dtype=torch.int32)
            )
        self.register_load_state_dict_post_hook(_refresh_after_load)  # type: ignore[no-untyped-call]
        if not self.weight.is_meta:  # a meta-device build only describes shapes (load checks)
            self.refresh()

    @classmethod
    def from_float(
        cls,
        linear: nn.Linear | SmoothedLinear,
        mode: str,
        input_range: tuple[float, float] | None = None,
        activation: str = "none",
    ) -> QuantLinear:
        """Quantize a float (optionally smoothed) linear. input_range: static only, the
        calibrated (lo, hi) of the input *after* the smoothing pre-scale; activation: applied
        to the output (the module that applied it before must be removed by the caller)."""
        has_bias = linear.bias is not None
        side = linear.outlier_weight if isinstance(linear, SmoothedLinear) else None
        outliers = 0 if side is None else side.shape[1]
        q = cls(linear.in_features, linear.out_features, has_bias, mode, activation, outliers)
        with torch.no_grad():
            if isinstance(linear, SmoothedLinear):
                q.input_multiplier.copy_(linear.input_multiplier)
                if q.outlier_index is not None and q.outlier_weight is not None:
                    q.outlier_index.copy_(cast(Tensor, linear.outlier_index))
                    q.outlier_weight.copy_(cast(Tensor, side))
            w_q, w_scale = int8.quantize_weight(linear.weight)
            q.weight.copy_(w_q)
            q.weight_scale.copy_(w_scale)
            if linear.bias is not None and q.bias is not None:
                q.bias.copy_(linear.bias.detach().float())
            if mode == "static":
                if input_range is None:
                    raise ValueError("static QuantLinear needs the calibrated input_range")
                scale, zp = int8.affine_qparams(*input_range)
                q.input_scale.fill_(scale)
                q.input_zero_point.fill_(zp)
        q.refresh()
        return q

    def refresh(self) -> None:
        """Derive the packed weight and the fused static multiplier from the saved buffers."""
        # what the kernel multiplies: the saved weight, or a 7-bit copy on CPUs without VNNI
        # when the saved one has 8-bit values (int8.kernel_weight_qmax)
        w_k, s_k = int8.kernel_weight(self.weight, self.weight_scale)
        requantized = w_k is not self.weight
        self.register_buffer("kernel_weight", w_k if requantized else None, persistent=False)
        self.register_buffer("kernel_scale", s_k if requantized else None, persistent=False)
        self.gemm = int8.gemm_kernel(self.in_features)
        if self.gemm == "squant":
            packed, compensation = int8.pack_weight_blocked(w_k)
        else:
            packed, compensation = int8.pack_weight(w_k), None
        self.register_buffer("packed_weight", packed, persistent=False)
        self.register_buffer("weight_compensation", compensation, persistent=False)
        self.register_buffer(
            "weight_zero_point",
            torch.zeros(self.out_features, dtype=torch.int32),
            persistent=False,
        )
        if self.mode == "static":
            # Python scalars: the GEMM takes them as compile-time constants.
            self._x_scale = float(self.input_scale)
            self._x_zero_point = int(self.input_zero_point)
            self.register_buffer(
                "_static_multiplier", self.input_multiplier / self._x_scale, persistent=False
            )

    @property
    def outliers(self) -> int:
        """How many input channels run in float beside the int8 GEMM (0: none)."""
        return 0 if self.outlier_index is None else self.outlier_index.numel()

    def _packed(self) -> Tensor:
        # torch.export cannot carry oneDNN's opaque packed buffer: exported graphs pack the
        # frozen int8 weight in-graph and AOTInductor folds that into a constant at build time.
        # squant's packed weight is a plain tensor and goes in as it is.
        if self.gemm == "onednn" and torch.compiler.is_exporting():
            return int8.pack_weight(self._kernel_weight()[0])
        return self.packed_weight

    def _kernel_weight(self) -> tuple[Tensor, Tensor]:
        if self.kernel_weight is not None and self.kernel_scale is not None:
            return self.kernel_weight, self.kernel_scale
        return self.weight, self.weight_scale

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        x2 = x.reshape(-1, self.in_features)
        if self.weight_compensation is not None:
            y = self._forward_squant(x2, x.dtype)
        else:
            y = self._forward_onednn(x2, x.dtype)
        return y.reshape(*shape[:-1], self.out_features)

    def _forward_squant(self, x2: Tensor, dtype: torch.dtype) -> Tensor:
        # One call does it all: the per-token scale (dynamic), bias, the outlier channels'
        # float share and the activation run in the GEMM's epilogue.
        assert self.weight_compensation is not None
        index = side_w = side_x = None
        if self.outlier_index is not None and self.outlier_weight is not None:
            index, side_w = self.outlier_index, self.outlier_weight.t().contiguous()
        if self.mode == "static":
            if index is not None:
                side_x = x2.index_select(-1, index).float()
            x_q = int8.quantize_static(x2, self._static_multiplier, self._x_zero_point)
            x_scale, x_zero_point, row_scale = self._x_scale, self._x_zero_point, None
        else:
            # one pass per row: the per-token scale, the integers and the outlier channels
            x_q, row_scale, side = int8.quantize_rows(x2, self.input_multiplier, index)
            if index is not None:
                side_x = side
            x_scale, x_zero_point = 1.0, int8.SYMMETRIC_ZP
        out_dtype = dtype if dtype in (torch.float32, torch.bfloat16) else torch.float32
        y = int8.squant_linear(
            x_q,
            x_scale,
            x_zero_point,
            self.packed_weight,
            self.weight_compensation,
            self._kernel_weight()[1],
            self.bias,
            out_dtype,
            self.activation,
            row_scale=row_scale,
            side_x=side_x,
            side_w=side_w,
        )
        return y.to(dtype)

    def _forward_onednn(self, x2: Tensor, dtype: torch.dtype) -> Tensor:
        side = self.outlier_index is not None
        w_scale, w_zp = self._kernel_weight()[1], self.weight_zero_point
        if self.mode == "static":
            x_q = int8.quantize_static(x2, self._static_multiplier, self._x_zero_point)
            # the activation must follow the outlier channels' share: outside the GEMM then
            y = int8.int8_linear(
                x_q,
                self._x_scale,
                self._x_zero_point,
                self._packed(),
                w_scale,
                w_zp,
                self.bias,
                torch.float32 if side else dtype,
                "none" if side else self.activation,
            )
            if side:
                y = add_outliers(y, x2, self.outlier_index, self.outlier_weight)
                y = int8.apply_activation(y, self.activation).to(dtype)
            return y
        x_q, token_scale = int8.quantize_per_token(x2 * self.input_multiplier)
        y = int8.int8_linear(
            x_q, 1.0, int8.SYMMETRIC_ZP, self._packed(), w_scale, w_zp, None, torch.float32
        )
        y = y * token_scale
        if self.bias is not None:
            y = y + self.bias
        y = add_outliers(y, x2, self.outlier_index, self.outlier_weight)
        y = int8.apply_activation(y, self.activation).to(dtype)
        if self.activation != "none":
            y = int8.stored(y)
        return y

    def dequantized_weight(self) -> Tensor:
        """The float weight the int8 GEMM effectively applies to the *smoothed* input."""
        w_k, s_k = self._kernel_weight()
        return w_k.float() * s_k[:, None]

    def extra_repr(self) -> str:
        s = f"in={self.in_features}, out={self.out_features}, bias={self.bias is not None}"
        s += f", mode={self.mode}"
        if self.activation != "none":
            s += f", activation={self.activation}"
        if self.outliers:
            s += f", float_channels={self.outliers}"
        if self.mode == "static":
            s += f", x_scale={self._x_scale:.4g}, x_zp={self._x_zero_point}"
        return s

    # oneDNN's packed weight is an opaque tensor that cannot be copied or pickled: drop what
    # is derived and derive it again (deepcopy, pickle, multiprocessing), for the GEMM of the
    # process it lands in.
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        derived = ("packed_weight", "weight_compensation", "kernel_weight", "kernel_scale")
        state["_buffers"] = {k: v for k, v in self._buffers.items() if k not in derived}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.refresh()
