"""Rewrites of the traced graph that inductor cannot find itself, because they join two of
squant's own kernels: run by inductor after its own passes (post-grad, on the ATen graph),
set through inductor's config for squant's compile and export calls only.

- A GEMM whose float output is only per-token quantized for the next GEMM (a BERT layer's
  FFN-in + GELU, feeding the FFN-out's per-token u8 input) becomes one call of
  ``squant::int8_linear_quantize_rows``: the float output stays in the core's cache instead
  of going to memory and back (6 MB per layer at 8 x 128 tokens). Same integers, scales and
  outlier channels as the two calls (tests/test_int8.py checks bit equality).
- The Q|K|V GEMM feeding the INT8 attention becomes one call of
  ``squant::int8_linear_attention``: each batch row's Q|K|V stays in the core's cache for its
  heads (4.7 MB of float per layer at 8 x 128 that would go to memory and back, then be read
  with a cache miss per row and head). Bit-identical outputs too.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass
from torch.fx.operator_schemas import normalize_function

from ..kernels import build_key

_aten = torch.ops.aten
# reshapes between the GEMM and the quantize step ([T, N] -> [B, S, N] -> [T, N])
_VIEWS = (_aten.view.default, _aten.reshape.default, _aten._unsafe_view.default)


def _kwargs(node: torch.fx.Node) -> dict[str, Any]:
    pair = normalize_function(
        node.target,  # type: ignore[arg-type]
        node.args,
        node.kwargs,
        normalize_to_only_use_kwargs=True,
    )
    assert pair is not None, node
    return dict(pair.kwargs)


def _shape(node: Any) -> tuple[int, ...] | None:
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return tuple(val.shape) if isinstance(val, torch.Tensor) else None


def _replace(
    graph: torch.fx.Graph,
    node: torch.fx.Node,
    fused_op: Any,
    values: dict[str, Any],
    dead: list[torch.fx.Node],
) -> None:
    """Call fused_op where node was (its arguments from values, by schema name), hand node's
    users to it, and erase node and the now unused nodes that fed it (dead, users first)."""
    # positional, in the schema's order (inductor's lowering normalizes positional calls)
    args = tuple(values.get(a.name, a.default_value) for a in fused_op._schema.arguments)
    with graph.inserting_before(node):
        new = graph.call_function(fused_op, args=args)
    # the same outputs (shapes, dtypes); not the rest of the old node's meta, whose recorded
    # eager inputs belong to the old call's schema
    new.meta["val"] = node.meta["val"]
    node.replace_all_uses_with(new)
    graph.erase_node(node)
    for unused in dead:
        graph.erase_node(unused)


def _float_gemm_for_one_use(source: torch.fx.Node, lin: dict[str, Any]) -> bool:
    """Whether an int8_linear call (its normalized arguments: lin) can join the kernel that
    reads it: a float32 output on the default epilogue, read by nothing else."""
    return (
        len(source.users) == 1
        and lin.get("out_dtype") in (None, torch.float32)
        and lin.get("epilogue", "auto") == "auto"
    )


def fuse_linear_quantize(graph: torch.fx.Graph) -> int:
    """Replace quantize_per_token(int8_linear(...)) by int8_linear_quantize_rows where the
    GEMM's float32 output has no other use; returns how many were fused."""
    linear = torch.ops.squant.int8_linear.default
    quantize = torch.ops.squant.quantize_per_token.default
    fused_op = torch.ops.squant.int8_linear_quantize_rows.default
    fused = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not quantize:
            continue
        q = _kwargs(node)
        source, chain = _view_chain(q["x"])
        if not isinstance(source, torch.fx.Node) or source.target is not linear:
            continue
        lin = _kwargs(source)
        if (
            not _float_gemm_for_one_use(source, lin)
            or q.get("path", "auto") != "auto"
            or _shape(source) is None
            or _shape(source) != _shape(q["x"])
        ):
            continue
        lin.pop("out_dtype", None)
        lin.pop("epilogue", None)
        values = {**lin, "multiplier": q.get("multiplier"), "side_index": q.get("side_index")}
        _replace(graph, node, fused_op, values, [*chain, source])
        fused += 1
    return fused


def _view_chain(node: Any) -> tuple[Any, list[torch.fx.Node]]:
    """The node under a chain of single-use reshapes, and the reshapes."""
    chain: list[torch.fx.Node] = []
    while isinstance(node, torch.fx.Node) and node.target in _VIEWS and len(node.users) == 1:
        chain.append(node)
        node = node.args[0]
    return node, chain


def fuse_linear_attention(graph: torch.fx.Graph) -> int:
    """Replace int8_attention(int8_linear(...).view(B, S, 3·H·D)) by int8_linear_attention
    where the GEMM (float32 output, no activation) feeds nothing else; returns how many."""
    linear = torch.ops.squant.int8_linear.default
    attention = torch.ops.squant.int8_attention.default
    fused_op = torch.ops.squant.int8_linear_attention.default
    fused = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not attention:
            continue
        att = _kwargs(node)
        source, chain = _view_chain(att["qkv"])
        if not isinstance(source, torch.fx.Node) or source.target is not linear or not chain:
            continue
        lin = _kwargs(source)
        qkv_shape = _shape(att["qkv"])
        if (
            not _float_gemm_for_one_use(source, lin)
            or lin.get("activation", "none") != "none"
            or qkv_shape is None
            or len(qkv_shape) != 3
            or chain[0].target not in (_aten.view.default, _aten.reshape.default)
        ):
            continue
        # the batch size as the graph has it (an int, or a symbolic size's node): the first
        # dimension the reshape to [B, S, 3·H·D] was given
        batch = chain[0].args[1][0]  # type: ignore[index]
        values = {
            **lin,
            "key_mask": att.get("key_mask"),
            "batch": batch,
            "num_heads": att["num_heads"],
            "scaling": att["scaling"],
            "isa": att.get("isa", "auto"),
        }
        _replace(graph, node, fused_op, values, [*chain, source])
        fused += 1
    return fused


class SquantFusions(CustomGraphPass):
    """squant's post-grad rewrites as one inductor pass; its uuid keys inductor's caches: a
    hash of this file and of the kernels' sources, so a changed rewrite, or a kernel whose op
    schema changed, never reuses an old compiled graph (a cached C++ wrapper calls each op
    with the argument list of the schema it was generated for)."""

    def __call__(self, graph: torch.fx.Graph) -> None:
        if _kernels_loaded():
            fuse_linear_quantize(graph)
            fuse_linear_attention(graph)

    def uuid(self) -> Any:
        return hashlib.sha256(Path(__file__).read_bytes() + build_key().encode()).hexdigest()


def _kernels_loaded() -> bool:
    return hasattr(torch.ops.squant, "int8_linear_quantize_rows") and hasattr(
        torch.ops.squant, "int8_linear_attention"
    )


SQUANT_FUSIONS = SquantFusions()
# the inductor config entries that turn the rewrites on, for torch.compile options and
# AOTInductor's inductor_configs
INDUCTOR_OPTIONS: dict[str, Any] = {"post_grad_custom_post_pass": SQUANT_FUSIONS}
