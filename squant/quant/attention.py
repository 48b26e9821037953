"""Self-attention with Q, K and V computed by one GEMM.

Q, K and V read the same input, so SmoothQuant gives them one shared smoothing vector; the
input is then quantized once and the three projections run as one [3·hidden, hidden] GEMM.
The attention itself is the model's own (``config._attn_implementation``: sdpa, eager, ...).
"""

from __future__ import annotations

import sys
import warnings
from typing import Any, cast

import torch
from torch import Tensor, nn

from ..errors import SquantError
from .config import AttentionKind
from .mappings import hf_config


def fuse_qkv_linear(query: nn.Linear, key: nn.Linear, value: nn.Linear) -> nn.Linear:
    """One float linear whose output is [q | k | v] (exactly the three outputs, concatenated)."""
    in_f = query.in_features
    outs = [m.out_features for m in (query, key, value)]
    has_bias = query.bias is not None
    fused = nn.Linear(in_f, sum(outs), bias=has_bias, dtype=query.weight.dtype)
    with torch.no_grad():
        fused.weight.copy_(torch.cat([query.weight, key.weight, value.weight]))
        if has_bias:
            fused.bias.copy_(torch.cat([query.bias, key.bias, value.bias]))
    return fused


class FusedSelfAttention(nn.Module):
    """Replaces a Hugging Face self-attention module (same call signature and return).

    qkv: [.., hidden] -> [.., 3·heads·head_dim], ordered q | k | v, each head-major.
    out_proj: the output projection when the original module owns it (DistilBERT's out_lin),
    kept under its original attribute name so module names do not change.
    """

    def __init__(
        self,
        original: nn.Module,
        qkv: nn.Module,
        num_heads: int,
        out_name: str | None = None,
    ) -> None:
        super().__init__()
        self.config = original.config
        self.num_heads = num_heads
        hf = cast(Any, original)  # the HF attention module's plain attributes
        self.head_dim = int(hf.attention_head_size)
        self.scaling = float(hf.scaling)
        self.is_causal = False
        self.dropout_p = float(getattr(getattr(original, "dropout", None), "p", 0.0))
        self.qkv = qkv
        self.out_name = out_name
        if out_name is not None:
            setattr(self, out_name, getattr(original, out_name))
        # The model's own eager attention is the fallback when no fused kernel is configured.
        self._eager_attention = sys.modules[type(original).__module__].eager_attention_forward
        # transformers' registry of attention kernels; imported here, not at squant's import,
        # because transformers.modeling_utils pulls in torchao (slow, and noisy on CPUs)
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        self._attention_functions = ALL_ATTENTION_FUNCTIONS
        self.train(original.training)

    def forward(
        self, hidden_states: Tensor, attention_mask: Tensor | None = None, **kwargs: Any
    ) -> tuple[Tensor, Tensor | None]:
        for name in ("encoder_hidden_states", "cache", "past_key_values"):
            if kwargs.pop(name, None) is not None:
                raise SquantError(f"squant's fused attention is encoder-only; got {name}")
        input_shape = hidden_states.shape[:-1]
        implementation = hf_config(self)._attn_implementation
        if implementation == SQUANT_INT8_ATTENTION and hidden_states.dim() == 3:
            # straight from the Q|K|V GEMM's output to the attention-output GEMM's input
            out = torch.ops.squant.int8_attention(
                self.qkv(hidden_states), attention_mask, self.num_heads, self.scaling
            )
            if self.out_name is not None:
                out = getattr(self, self.out_name)(out)
            return out, None
        qkv = self.qkv(hidden_states).view(*input_shape, 3, self.num_heads, self.head_dim)
        q, k, v = (t.transpose(1, 2) for t in qkv.unbind(dim=-3))
        attention = self._attention_functions.get_interface(implementation, self._eager_attention)
        out, weights = attention(
            self,
            q,
            k,
            v,
            attention_mask,
            dropout=self.dropout_p if self.training else 0.0,
            scaling=self.scaling,
            **kwargs,
        )
        out = out.reshape(*input_shape, -1).contiguous()
        if self.out_name is not None:
            out = getattr(self, self.out_name)(out)
        return out, weights


# ---------------------------------------------------------------------------------------------
# "squant" attention: plain matmul-softmax-matmul, for short sequences on CPUs.
#
# At encoder lengths (<= 512 tokens) two batched BF16 GEMMs plus one fused softmax beat the
# CPU flash-attention kernel, and a key-padding bias of shape [B, 1, 1, S] (instead of the
# [B, 1, S, S] mask transformers builds) keeps the softmax kernel cheap. Registered with
# transformers under the name "squant"; squant.compile picks it where it measures faster.
SQUANT_ATTENTION = "squant"


def key_padding_bias(
    batch_size: int,
    q_length: int,
    kv_length: int,
    attention_mask: Tensor | None = None,
    dtype: torch.dtype = torch.float32,
    **_kwargs: Any,
) -> Tensor | None:
    """Additive bias [B, 1, 1, kv] (0 keep, dtype-min drop) from a 2D padding mask; exact for
    bidirectional encoders, where every query row sees the same keys."""
    if attention_mask is None:
        return None
    if attention_mask.dim() != 2:
        raise SquantError("squant attention expects a 2D [batch, seq] attention mask")
    keep = attention_mask[:, -kv_length:].bool()[:, None, None, :]
    return torch.zeros((), dtype=dtype).masked_fill(~keep, torch.finfo(dtype).min)


def squant_attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **_kwargs: Any,
) -> tuple[Tensor, None]:
    """softmax(q kᵀ · scale + bias) v with the softmax in float32; q, k, v: [B, H, S, D].
    Returns [B, S, H, D] like transformers' attention functions."""
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    scores = torch.matmul(query, key.transpose(-1, -2)).float() * scale
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attention_mask, torch.finfo(torch.float32).min)
        else:
            scores = scores + attention_mask.float()
    probs = torch.softmax(scores, dim=-1).to(value.dtype)
    if dropout > 0.0:
        probs = nn.functional.dropout(probs, p=dropout, training=module.training)
    return torch.matmul(probs, value).transpose(1, 2).contiguous(), None


# ---------------------------------------------------------------------------------------------
# "squant_int8" attention: squant's C++ kernel (kernels/int8_attention.cpp), Q·Kᵀ in int8 with
# a scale per query and key row, softmax over the valid keys only, P·V in 16-bit integers.
# It reads the fused Q|K|V output directly (FusedSelfAttention) and takes the 2D key-padding
# mask as is.
SQUANT_INT8_ATTENTION = "squant_int8"


def key_padding_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    attention_mask: Tensor | None = None,
    **_kwargs: Any,
) -> Tensor | None:
    """The 2D [B, kv] keep-mask itself (the int8 kernel skips padded keys)."""
    if attention_mask is None:
        return None
    if attention_mask.dim() != 2:
        raise SquantError("squant attention expects a 2D [batch, seq] attention mask")
    return attention_mask[:, -kv_length:].bool()


def squant_int8_attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **_kwargs: Any,
) -> tuple[Tensor, None]:
    """The int8 kernel for attention modules that hold separate q, k, v ([B, H, S, D]);
    FusedSelfAttention calls the kernel on its Q|K|V output without this regrouping."""
    b, h, s, d = query.shape
    qkv = torch.stack([t.transpose(1, 2) for t in (query, key, value)], dim=2)
    scale = d**-0.5 if scaling is None else scaling
    out = torch.ops.squant.int8_attention(qkv.reshape(b, s, 3 * h * d), attention_mask, h, scale)
    return out.view(b, s, h, d), None


def resolve_attention_kind(kind: AttentionKind) -> AttentionKind:
    """ "auto" -> "int8" where squant's kernel library loads (building it on first use), else
    "float" with a warning saying why; "float" and "int8" as given."""
    if kind != "auto":
        return kind
    from .. import kernels

    try:
        kernels.load()
    except SquantError as exc:
        warnings.warn(
            f"squant: int8 attention is unavailable ({exc}); the attention stays in float",
            stacklevel=3,
        )
        return "float"
    return "int8"


def use_attention_kind(model: nn.Module, kind: str) -> None:
    """Make a model with FusedSelfAttention run its attention as `kind` says ("float": the
    model's own; "int8": squant's kernel). The quantized model's setting, applied by quantize
    and again by load."""
    if kind == "int8":
        register_squant_attention(int8=True)
        hf_config(model)._attn_implementation = SQUANT_INT8_ATTENTION


def uses_int8_attention(model: nn.Module) -> bool:
    config = getattr(model, "config", None)
    return getattr(config, "_attn_implementation", None) == SQUANT_INT8_ATTENTION


def register_squant_attention(int8: bool = False) -> None:
    """Make `config._attn_implementation = "squant"` valid, and "squant_int8" with int8=True
    (which builds or loads squant's C++ kernels). Idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    AttentionInterface.register(SQUANT_ATTENTION, squant_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(SQUANT_ATTENTION, key_padding_bias)
    if int8:
        from .. import kernels

        kernels.load()
        AttentionInterface.register(SQUANT_INT8_ATTENTION, squant_int8_attention)
        ALL_MASK_ATTENTION_FUNCTIONS.register(SQUANT_INT8_ATTENTION, key_padding_mask)
