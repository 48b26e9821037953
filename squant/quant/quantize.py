"""Model surgery: fuse Q/K/V, smooth, calibrate, and swap linears for int8 ones.

    quantize(model, SmoothQuantConfig(mode="static", alpha=0.5), calibration=batches)

Per encoder layer (post-LayerNorm), with s from smoothing_factors():
  qkv      input = LayerNorm output (also the residual): x/s at run time (fused into the
           quantize step), one s shared by Q, K and V.
  attn_out input = attention context: 1/s folded into V's output rows, exact because the
           attention output is linear in V's channels; no run-time cost.
  ffn_in   input = LayerNorm output: x/s at run time.
  ffn_out  input = GELU output: x/s at run time.
The attention's Q·Kᵀ runs in int8 in squant's kernel (SmoothQuantConfig.attention), with
softmax in FP32 and P·V in 16-bit integers. Left in floating point: embeddings, LayerNorms,
the pooler and task heads (one row per sequence: int8 saves nothing there and costs accuracy).
"""

from __future__ import annotations

import copy
import dataclasses
import fnmatch
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from torch import Tensor, nn

from ..errors import SquantError
from . import int8
from .attention import (
    FusedSelfAttention,
    fuse_qkv_linear,
    resolve_attention_kind,
    use_attention_kind,
)
from .calibrate import Histogram, InputObservers, SiteStats, prepare_batches, run_batches
from .config import SmoothQuantConfig
from .mappings import EncoderLayout, fusable_activation, layout_for, linear_at
from .qlinear import QuantLinear, SmoothedLinear
from .record import Coverage, LinearRecord, QuantizationRecord
from .smooth import ALPHA_GRID, search_alpha, smoothing_factors, weight_channel_absmax


@dataclass(frozen=True)
class Site:
    """One GEMM squant quantizes: its module name, kind and encoder layer index."""

    name: str
    kind: str
    layer: int


def encoder_layers(model: nn.Module, layout: EncoderLayout) -> tuple[str, nn.ModuleList]:
    base = cast(nn.Module, model.base_model)
    prefix = "" if base is model else f"{model.base_model_prefix}."
    layers = base.get_submodule(layout.layers)
    if not isinstance(layers, nn.ModuleList):
        raise SquantError(f"{prefix}{layout.layers} is not the list of encoder layers expected")
    return f"{prefix}{layout.layers}", layers


def calibration_coverage(batches: list[dict[str, Tensor]]) -> Coverage:
    """What the calibration saw (sequences, real tokens, shortest and longest sequence),
    recorded with the model: static ranges hold only for inputs like these."""
    lengths: list[int] = []
    for b in batches:
        ids = b["input_ids"]
        mask = b.get("attention_mask")
        real = mask.sum(dim=1) if mask is not None else torch.full((ids.shape[0],), ids.shape[1])
        lengths += [int(n) for n in real]
    return Coverage(
        sequences=len(lengths),
        tokens=sum(lengths),
        min_length=min(lengths),
        max_length=max(lengths),
    )


def fuse_attention(model: nn.Module, layout: EncoderLayout) -> None:
    """Replace each layer's self-attention with FusedSelfAttention (float Q|K|V GEMM). Exact."""
    _, layers = encoder_layers(model, layout)
    out_in_attention = layout.attn_out.startswith(layout.attention + ".")
    out_name = layout.attn_out.rsplit(".", 1)[1] if out_in_attention else None
    num_heads = int(getattr(model.config, layout.num_heads))
    for layer in layers:
        attn = layer.get_submodule(layout.attention)
        if isinstance(attn, FusedSelfAttention):
            continue
        qkv = fuse_qkv_linear(*(getattr(attn, n) for n in (layout.query, layout.key, layout.value)))
        layer.set_submodule(layout.attention, FusedSelfAttention(attn, qkv, num_heads, out_name))


def find_sites(model: nn.Module, layout: EncoderLayout) -> list[Site]:
    """The four GEMM sites of every layer, named as in model.named_modules() after fusion."""
    path, layers = encoder_layers(model, layout)
    sites = []
    for i in range(len(layers)):
        p = f"{path}.{i}."
        sites += [
            Site(f"{p}{layout.attention}.qkv", "qkv", i),
            Site(f"{p}{layout.attn_out}", "attn_out", i),
            Site(f"{p}{layout.ffn_in}", "ffn_in", i),
            Site(f"{p}{layout.ffn_out}", "ffn_out", i),
        ]
    return sites


def _excluded(name: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


AlphaChooser = Callable[[Site, nn.Linear], float]


def outlier_channels(
    stats: Mapping[str, SiteStats], sites: Iterable[Site], config: SmoothQuantConfig
) -> dict[str, Tensor]:
    """Per site of the configured kinds, the input channels with the largest calibrated
    magnitude (sorted): multiplied in float beside the int8 GEMM (outlier_channels)."""
    k, kinds = config.outlier_channels, config.outlier_sites or ()  # resolved: never None
    out: dict[str, Tensor] = {}
    for site in sites:
        if k == 0 or site.kind not in kinds:
            continue
        absmax = stats[site.name].range.absmax
        out[site.name] = absmax.topk(min(k, absmax.numel())).indices.sort().values
    return out


def _without(x: Tensor, channels: Tensor | None, dim: int = -1) -> Tensor:
    """x with the given channels (along dim) set to zero: what the int8 GEMM sees of it."""
    if channels is None:
        return x
    x = x.clone()
    x.index_fill_(dim, channels, 0.0)
    return x


def fixed_alpha(alpha: float | Mapping[str, float]) -> AlphaChooser:
    """One alpha for every site, or one per site name."""
    if isinstance(alpha, Mapping):
        return lambda site, _linear: float(alpha[site.name])
    return lambda _site, _linear: float(alpha)


def searched_alpha(
    stats: Mapping[str, SiteStats],
    config: SmoothQuantConfig,
    outliers: Mapping[str, Tensor] | None = None,
) -> AlphaChooser:
    """Per site, the alpha with the smallest int8 output error on its token sample (of the
    channels the int8 GEMM multiplies: outlier channels are exact in float)."""
    outliers = outliers or {}

    def choose(site: Site, linear: nn.Linear) -> float:
        st = stats[site.name]
        lo, hi = st.range.bounds
        skip = outliers.get(site.name)
        best, _errors = search_alpha(
            _without(st.search_rows(), skip),
            _without(linear.weight.detach().float(), skip),
            _without(lo, skip),
            _without(hi, skip),
            config.mode_for(site.kind),
            grid=tuple(a for a in ALPHA_GRID if a <= config.alpha_max + 1e-9),
        )
        return best

    return choose


@torch.no_grad()
def _apply_smoothing(
    model: nn.Module,
    layout: EncoderLayout,
    sites: list[Site],
    stats: Mapping[str, SiteStats],
    choose_alpha: AlphaChooser,
    outliers: Mapping[str, Tensor] | None = None,
) -> tuple[dict[str, Tensor], dict[str, float]]:
    """Smooth every site in place (exact in real arithmetic). Returns per site m = 1/s (the
    per-channel factor between the original input and the input its GEMM now sees; 0 on
    outlier channels, which the GEMM no longer sees) and the alpha used."""
    outliers = outliers or {}
    _, layers = encoder_layers(model, layout)
    multipliers: dict[str, Tensor] = {}
    alphas: dict[str, float] = {}
    # attn_out first: folding into V changes the QKV weight that QKV's smoothing reads.
    for site in sorted(sites, key=lambda s: s.kind != "attn_out"):
        linear = linear_at(model, site.name)
        alphas[site.name] = alpha = choose_alpha(site, linear)
        skip = outliers.get(site.name)
        # outlier channels get s = 1 (no activation magnitude left to migrate)
        s = smoothing_factors(
            _without(stats[site.name].range.absmax, skip),
            weight_channel_absmax(linear.weight),
            alpha,
        )
        multipliers[site.name] = _without(1.0 / s, skip)
        if site.kind == "attn_out":
            # context = softmax(QKᵀ)·V is linear in V's channels: scaling V's output rows
            # scales the context's channels, at no run-time cost.
            qkv = linear_at(layers[site.layer], f"{layout.attention}.qkv")
            v_rows = slice(2 * linear.in_features, 3 * linear.in_features)
            qkv.weight[v_rows] /= s[:, None]
            if qkv.bias is not None:
                qkv.bias[v_rows] /= s
            linear.weight.mul_(s[None, :])
            if skip is not None:  # the smoothing is folded; only the outliers need a module
                ones = torch.ones_like(s)
                model.set_submodule(site.name, SmoothedLinear.from_linear(linear, ones, skip))
        else:
            model.set_submodule(site.name, SmoothedLinear.from_linear(linear, s, skip))
    return multipliers, alphas


def _observe(
    model: nn.Module,
    names: Iterable[str],
    make_observer: Any,
    batches: list[dict[str, Tensor]],
    desc: str,
    progress: bool,
) -> dict[str, Any]:
    modules = {n: model.get_submodule(n) for n in names}
    # A SmoothedLinear multiplies its input by 1/s first: observe what its GEMM sees.
    multipliers: dict[str, Tensor] = {
        n: m.input_multiplier for n, m in modules.items() if isinstance(m, SmoothedLinear)
    }
    with InputObservers(modules, make_observer, multipliers) as obs:
        run_batches(model, batches, obs, desc=desc, progress=progress)
    for name, ob in obs.observers.items():
        if getattr(ob, "tokens", 1) == 0:
            raise SquantError(f"no calibration tokens reached {name}: all positions were padding?")
    return obs.observers


def _prepare(
    model: nn.Module, calibration: Any, exclude: Iterable[str], inplace: bool
) -> tuple[nn.Module, EncoderLayout, list[Site], list[dict[str, Tensor]]]:
    layout = layout_for(model)
    dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
    if dtypes != {torch.float32}:
        raise SquantError(
            f"expected a float32 model, got parameter dtypes {sorted(map(str, dtypes))}; "
            "load it with torch_dtype=torch.float32"
        )
    batches = prepare_batches(calibration, model)
    if not inplace:
        model = copy.deepcopy(model)
    model.eval()
    _pin_source_path(model)
    fuse_attention(model, layout)
    all_sites = find_sites(model, layout)
    sites = [s for s in all_sites if not _excluded(s.name, exclude)]
    if not sites:
        raise SquantError(
            f"exclude={list(exclude)} matches all {len(all_sites)} quantizable linears: nothing "
            f"left to quantize (names look like {all_sites[0].name!r})"
        )
    return model, layout, sites, batches


def smooth(
    model: nn.Module,
    calibration: Iterable[Any],
    alpha: float | Mapping[str, float] = 0.5,
    *,
    exclude: Iterable[str] = (),
    outliers: Mapping[str, Tensor] | None = None,
    inplace: bool = False,
    progress: bool = True,
) -> nn.Module:
    """The float model with Q/K/V fused and SmoothQuant applied: same outputs as the input
    model (up to float rounding), activation outliers moved into the weights.
    outliers: per site name, input channels kept out of the smoothing and applied separately
    (as a quantized model with float outlier channels does; see QuantLinear.outlier_index)."""
    model, layout, sites, batches = _prepare(model, calibration, exclude, inplace)
    stats = _observe(model, [s.name for s in sites], SiteStats, batches, "smoothing", progress)
    _apply_smoothing(model, layout, sites, stats, fixed_alpha(alpha), outliers)
    return model.eval()


def _pin_source_path(model: nn.Module) -> None:
    """Make the checkpoint path the model was loaded from absolute, now: squant.save refuses
    to write over it, and a relative path would name another directory after a chdir."""
    config = getattr(model, "config", None)
    source = getattr(config, "_name_or_path", "")
    if isinstance(source, str) and source and Path(source).is_dir():
        config._name_or_path = str(Path(source).resolve())  # type: ignore[union-attr]


def quantize_encoder(
    model: nn.Module,
    config: SmoothQuantConfig | None = None,
    calibration: Iterable[Any] | None = None,
    *,
    inplace: bool = False,
    progress: bool = True,
) -> nn.Module:
    """SmoothQuant INT8 of a Hugging Face encoder; returns an nn.Module with the same forward
    signature and outputs. The input model is left untouched unless inplace=True.

    calibration: an iterable of tokenizer outputs (dicts with input_ids, attention_mask, ...)
    or input_ids tensors; a few dozen sentences of the target domain are enough.
    (squant.quantize takes sentence-transformers models too: squant/checkpoint/quantize_api.py.)
    """
    config = config or SmoothQuantConfig()
    if not int8.onednn_available():
        raise SquantError("this PyTorch build has no oneDNN (mkldnn): squant needs an x86-64 CPU")
    model, layout, sites, batches = _prepare(model, calibration, config.exclude, inplace)
    names = [s.name for s in sites]
    auto = config.alpha == "auto"
    sample = config.search_tokens if auto else 0
    stats = _observe(model, names, lambda: SiteStats(sample), batches, "calibrating", progress)
    outliers = outlier_channels(stats, sites, config)
    alpha = config.alpha  # "auto" or a float once the config has resolved it
    chooser = (
        fixed_alpha(alpha) if isinstance(alpha, float) else searched_alpha(stats, config, outliers)
    )
    multipliers, alphas = _apply_smoothing(model, layout, sites, stats, chooser, outliers)
    for st in stats.values():
        st.sample = st.extremes = None  # free the token samples before the next pass

    ranges: dict[str, tuple[float, float]] = {}
    static = [s.name for s in sites if config.mode_for(s.kind) == "static"]
    if static:
        if config.act_range == "minmax":
            ranges = {n: stats[n].range.range_after(multipliers[n]) for n in static}
        else:
            hists = _observe(model, static, Histogram, batches, "activation ranges", progress)
            ranges = {n: hists[n].percentile_range(config.percentile) for n in static}

    layers_path, _ = encoder_layers(model, layout)
    modules: dict[str, LinearRecord] = {}
    for site in sites:
        float_linear = linear_at(model, site.name)
        # The FFN activation moves into the int8 GEMM that feeds it (its epilogue, static).
        activation, absorbed = "none", None
        if site.kind == "ffn_in":
            act_path = f"{layers_path}.{site.layer}.{layout.ffn_act}"
            fused = fusable_activation(model.get_submodule(act_path))
            if fused is not None:
                activation, absorbed = fused, act_path
        mode = config.mode_for(site.kind)
        q = QuantLinear.from_float(float_linear, mode, ranges.get(site.name), activation)
        model.set_submodule(site.name, q)
        if absorbed is not None:
            model.set_submodule(absorbed, nn.Identity())
        modules[site.name] = LinearRecord(
            kind=site.kind,
            layer=site.layer,
            in_features=q.in_features,
            out_features=q.out_features,
            bias=q.bias is not None,
            mode=q.mode,
            alpha=alphas[site.name],
            activation=activation,
            absorbs=absorbed,
            outliers=q.outliers,
        )
    # the record states the attention that runs ("auto" resolved), so a saved model keeps it
    config = dataclasses.replace(config, attention=resolve_attention_kind(config.attention))
    use_attention_kind(model, config.attention)
    cast(Any, model).squant_info = QuantizationRecord(
        config, modules, calibration_coverage(batches)
    )
    return model.eval()
