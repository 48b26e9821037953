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
- A sublayer's residual add + LayerNorm + the next GEMM's input quantization (static u8 or
  per token) becomes one call of ``squant::add_layer_norm_quantize(_rows)``: one pass over each
  row where inductor's kernel makes three with barriers between them (distilbert 1 x 256, 2
  threads: 3% faster static and dynamic; real MiniLM 8 x 128: 1%). Only where the CPU has
  AVX512 (the op's plain C++ path is slower than inductor's vectorized kernel). Not bit-identical:
  the LayerNorm's sums run in another order (float rounding, tests/test_compile.py).
"""

from __future__ import annotations

import hashlib
import operator
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


def _args(node: Any, target: Any, nargs: int) -> list[Any]:
    """node's positional arguments if it calls target with nargs of them, else nargs Nones."""
    if (
        isinstance(node, torch.fx.Node)
        and node.op == "call_function"
        and node.target is target
        and len(node.args) == nargs
    ):
        return list(node.args)
    return [None] * nargs


def _from_int8_gemm(node: Any) -> bool:
    source = _view_chain(node)[0]
    return (
        isinstance(source, torch.fx.Node) and source.target is torch.ops.squant.int8_linear.default
    )


def _layer_norm_of(out: torch.fx.Node) -> dict[str, Any] | None:
    """The operands of a decomposed LayerNorm (float32, over the last dim) whose output is
    `out` = (v - mean) · rsqrt(var + eps) · weight + bias, v = x + residual with x an int8
    GEMM's output (a sublayer's) and the residual of the same shape: {x, residual, weight,
    bias, eps, nodes (the pattern's nodes but `out`, users first)}; None where it is not one."""
    add, mul = _aten.add.Tensor, _aten.mul.Tensor
    # out = scaled + bias, scaled = normed · weight, normed = (v - mean) · rsqrt(var + eps)
    scaled, bias = _args(out, add, 2)
    normed, weight = _args(scaled, mul, 2)
    centered, rstd = _args(normed, mul, 2)
    v, mean = _args(centered, _aten.sub.Tensor, 2)
    (var_eps,) = _args(rstd, _aten.rsqrt.default, 1)
    var, eps = _args(var_eps, add, 2)
    vm, var_i = _args(var, operator.getitem, 2)
    stats: Any = _args(vm, _aten.var_mean.correction, 2)
    x, residual = _args(v, add, 2)
    shape = _shape(v)
    if (
        stats[0] is None
        or x is None
        or shape is None
        or not isinstance(eps, float)
        or var_i != 0
        or _args(mean, operator.getitem, 2) != [vm, 1]
        or stats[0] is not v
        or list(stats[1]) not in ([len(shape) - 1], [-1])
        or vm.kwargs.get("correction") != 0
        or not vm.kwargs.get("keepdim")
        or v.meta["val"].dtype != torch.float32
    ):
        return None
    if _from_int8_gemm(residual):
        x, residual = residual, x
    if not (
        _from_int8_gemm(x)
        and _shape(x) == shape
        and _shape(residual) == shape
        and _shape(weight) == shape[-1:]
        and _shape(bias) == shape[-1:]
    ):
        return None
    nodes = [scaled, normed, rstd, var_eps, centered, var, mean, vm, v]
    inside = {out, *nodes}
    if not all(set(n.users) <= inside for n in nodes):
        return None
    return {
        "x": x,
        "residual": residual,
        "weight": weight,
        "bias": bias,
        "eps": eps,
        "nodes": nodes,
    }


def _static_quantize_of(cvt: torch.fx.Node) -> tuple[Any, Any, int, list[torch.fx.Node]] | None:
    """(source, multiplier, zero point, nodes users first) of the static quantize
    clamp(round(source · multiplier) + zp, 0, 255).to(uint8) ending at `cvt`, or None."""
    hi, dtype = _args(cvt, torch.ops.prims.convert_element_type.default, 2)
    lo, top = _args(hi, _aten.clamp_max.default, 2)
    shifted, bottom = _args(lo, _aten.clamp_min.default, 2)
    rounded, zero_point = _args(shifted, _aten.add.Tensor, 2)
    (scaled,) = _args(rounded, _aten.round.default, 1)
    x, multiplier = _args(scaled, _aten.mul.Tensor, 2)
    if x is None or dtype != torch.uint8 or top != 255 or bottom != 0:
        return None
    if not isinstance(zero_point, int):
        return None
    source, chain = _view_chain(x)
    nodes: list[torch.fx.Node] = [hi, lo, shifted, rounded, scaled, *chain]
    if not all(len(n.users) == 1 for n in nodes):
        return None
    return source, multiplier, zero_point, nodes


def _use_results(new: torch.fx.Node, first: int, old: torch.fx.Node) -> None:
    """Point the getitem users of the multi-output node `old` at `new`, shifted by `first`."""
    for user in list(old.users):
        assert user.target is operator.getitem, user
        index: Any = user.args[1]
        user.args = (new, index + first)


def fuse_layer_norm_quantize(graph: torch.fx.Graph) -> int:
    """Replace a sublayer's residual add + LayerNorm + the next GEMM's input quantization
    (static u8, or quantize_per_token) by one add_layer_norm_quantize(_rows) call; the
    LayerNorm's float output (the next residual) comes from the same call. Returns how many."""
    static_op = torch.ops.squant.add_layer_norm_quantize.default
    rows_op = torch.ops.squant.add_layer_norm_quantize_rows.default
    quantize = torch.ops.squant.quantize_per_token.default
    fused = 0
    order = {n: i for i, n in enumerate(graph.nodes)}
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        if node.target is quantize:
            q = _kwargs(node)
            if q.get("path", "auto") != "auto":
                continue
            source, chain = _view_chain(q["x"])
            quant_nodes: list[torch.fx.Node] = chain
            extra = {"multiplier": q.get("multiplier"), "side_index": q.get("side_index")}
        else:
            found = _static_quantize_of(node)
            if found is None:
                continue
            source, multiplier, zero_point, quant_nodes = found
            extra = {"multiplier": multiplier, "zero_point": zero_point}
        ln = _layer_norm_of(source) if isinstance(source, torch.fx.Node) else None
        # the fused call sits where the quantize was: the LayerNorm's other users (the next
        # residual add) must come after it (a node this pass added counts as one before it)
        if ln is None or any(
            order.get(u, -1) < order[node] for u in source.users if u not in quant_nodes
        ):
            continue
        fused_op = rows_op if node.target is quantize else static_op
        values = {k: ln[k] for k in ("x", "residual", "weight", "bias", "eps")} | extra
        args = tuple(values.get(a.name, a.default_value) for a in fused_op._schema.arguments)
        with graph.inserting_before(node):
            new = graph.call_function(fused_op, args=args)
            normed = graph.call_function(operator.getitem, args=(new, 0))
        normed.meta["val"] = source.meta["val"]
        if node.target is quantize:
            new.meta["val"] = (source.meta["val"], *node.meta["val"])
            _use_results(new, 1, node)
        else:
            new.meta["val"] = (source.meta["val"], node.meta["val"])
            with graph.inserting_before(node):
                q_node = graph.call_function(operator.getitem, args=(new, 1))
            q_node.meta["val"] = node.meta["val"]
            node.replace_all_uses_with(q_node)
        graph.erase_node(node)
        for unused in quant_nodes:
            graph.erase_node(unused)
        # the LayerNorm's other users (the next residual add) read the fused call's float output
        source.replace_all_uses_with(normed)
        graph.erase_node(source)
        for unused in ln["nodes"]:
            graph.erase_node(unused)
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
            if torch.ops.squant.layer_norm_vectorized():
                fuse_layer_norm_quantize(graph)

    def uuid(self) -> Any:
        return hashlib.sha256(Path(__file__).read_bytes() + build_key().encode()).hexdigest()


def _kernels_loaded() -> bool:
    return all(
        hasattr(torch.ops.squant, name)
        for name in ("int8_linear_quantize_rows", "int8_linear_attention", "layer_norm_vectorized")
    )


SQUANT_FUSIONS = SquantFusions()
# the inductor config entries that turn the rewrites on, for torch.compile options and
# AOTInductor's inductor_configs
INDUCTOR_OPTIONS: dict[str, Any] = {"post_grad_custom_post_pass": SQUANT_FUSIONS}
