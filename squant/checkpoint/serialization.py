"""Save and load quantized models as safetensors + JSON: no pickle, no code from the file.

Layout of a saved directory:
    squant.json        format version, model class, the HF config, quantization settings and
                       the list of quantized modules (shapes, modes)
    model.safetensors  every tensor (int8 weights, scales, the float rest)
    tokenizer files    when a tokenizer was given
Saving writes into a temporary sibling directory and renames it into place (squant.files):
a crash leaves the previous model intact, never new weights beside a stale squant.json.

Loading trusts nothing in the directory. The JSON is checked against a schema (types, ranges,
allowed class and module names, model sizes bounded); the model is first built on the meta
device (no memory) and its expected tensor names, shapes and dtypes are compared with the
safetensors header *before* anything is allocated, so a crafted size cannot ask for a
terabyte; after loading, every scale must be finite and positive, every zero point in
[0, 255], every float tensor finite. Nothing from the files is executed: the model class
comes from an allow-list, and safetensors holds data only. Anything else is one SquantError.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import safetensors.torch
import torch
import transformers
from torch import nn

from ..errors import SquantError, first_line
from ..files import atomic_directory, read_json_record
from ..quant import int8
from ..quant.attention import use_attention_kind
from ..quant.mappings import SUPPORTED_CLASSES, hf_config, layout_for, linear_at
from ..quant.qlinear import QuantLinear
from ..quant.quantize import encoder_layers, find_sites, fuse_attention
from ..quant.record import LinearRecord, QuantizationRecord, record_of
from ..version import __version__
from . import sentence_transformer
from .sentence_transformer import is_sentence_transformer

FORMAT = "squant"
FORMAT_VERSION = 1
CONFIG_FILE = "squant.json"
WEIGHTS_FILE = "model.safetensors"


def save(
    model: nn.Module,
    directory: str | Path,
    tokenizer: Any = None,
    *,
    overwrite: bool = False,
    protect: tuple[str | Path, ...] = (),
    extra_files: Mapping[str, str] | None = None,
) -> Path:
    """Write a model returned by squant.quantize() to `directory`, atomically.

    extra_files: name -> text written beside the model (a report), part of the same write.

    Refused: a directory holding files squant did not write (unless overwrite=True), and one
    that is, contains or lies inside the checkpoint the model was loaded from (or `protect`).
    """
    st = model if is_sentence_transformer(model) else None
    if st is not None:  # its HF model in squant's format, its other modules as they were
        model, tokenizer = sentence_transformer.inner_model(st), tokenizer or st.tokenizer
    info = record_of(model)
    if info is None:
        raise SquantError("this model was not quantized by squant.quantize(); nothing to save")
    meta = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "squant_version": __version__,
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "model_class": type(model).__name__,
        "hf_config": hf_config(model).to_dict(),
        "quantization": info.to_dict(),
    }
    source = getattr(model.config, "_name_or_path", "")
    sources = (*protect, source) if source and Path(source).is_dir() else tuple(protect)
    with atomic_directory(directory, CONFIG_FILE, sources, overwrite) as tmp:
        safetensors.torch.save_model(model, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        (tmp / CONFIG_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True))
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp))
        if st is not None:
            sentence_transformer.save_files(st, tmp)
            _write_model_card(tmp, meta)
        for name, text in (extra_files or {}).items():
            if Path(name).name != name or name.startswith("."):
                raise SquantError(f"extra file name {name!r} must be a plain file name")
            (tmp / name).write_text(text, encoding="utf-8")
    return Path(directory)


def _write_model_card(directory: Path, meta: dict[str, Any]) -> None:
    """README.md that says what the directory is (squant INT8, how to load it) before the
    original model card: sentence-transformers alone cannot read the INT8 weights."""
    config = meta["quantization"].get("config", {})
    card = directory / "README.md"
    original = card.read_text(encoding="utf-8") if card.is_file() else ""
    head = (
        "# SmoothQuant INT8 model written by squant\n\n"
        f"The weights here are squant {meta['squant_version']} INT8 "
        f"({config.get('mode', '?')} activations) of a {meta['model_class']}. "
        "Load with `squant.load(directory)` (it returns a SentenceTransformer), or with "
        "squant installed `SentenceTransformer(directory, trust_remote_code=True)`, which "
        "loads it through the module this directory declares (`squant.st_module`); plain "
        "`SentenceTransformer(directory)` refuses it.\n\n"
    )
    body = "## Original model card\n\n" + original if original.strip() else ""
    card.write_text(head + body, encoding="utf-8")


def read_meta(directory: str | Path) -> dict[str, Any]:
    path = Path(directory) / CONFIG_FILE
    if not Path(directory).is_dir():
        raise SquantError(f"{directory} is not a directory")
    if not path.is_file():
        raise SquantError(f"{directory} has no {CONFIG_FILE}: not a model saved by squant.save()")
    return read_json_record(
        path, FORMAT, FORMAT_VERSION, "a squant model description", max_bytes=MAX_META_BYTES
    )


# Bounds on the sizes a config may ask for (far above any BERT-family model; a crafted file
# cannot make squant build a huge model even on the meta device).
MAX_META_BYTES = 64 * 2**20
SIZE_LIMITS: dict[str, int] = {
    "vocab_size": 2**22,
    "hidden_size": 2**15,
    "dim": 2**15,
    "intermediate_size": 2**17,
    "hidden_dim": 2**17,
    "num_hidden_layers": 256,
    "n_layers": 256,
    "num_attention_heads": 1024,
    "n_heads": 1024,
    "max_position_embeddings": 2**16,
    "type_vocab_size": 2**10,
}


def _field(d: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(d, dict) or key not in d:
        raise SquantError(f"{where} is missing field {key!r}")
    value = d[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise SquantError(f"{where}: field {key!r} has the wrong type ({type(value).__name__})")
    return value


def _check_config_sizes(hf_config: dict[str, Any], where: str) -> None:
    for key, limit in SIZE_LIMITS.items():
        if key in hf_config:
            v = hf_config[key]
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= limit:
                raise SquantError(
                    f"{where}: hf_config.{key} = {v!r} is not an integer in [1, {limit}]"
                )


def _build(
    cls_name: str,
    model_type: str,
    hf_config: dict[str, Any],
    modules: Mapping[str, LinearRecord],
    meta: bool,
) -> nn.Module:
    """The model the directory describes, with empty int8 modules; on the meta device (shapes
    only, no memory) or for real."""
    with torch.device("meta" if meta else "cpu"):
        config = transformers.AutoConfig.for_model(model_type, **_config_kwargs(hf_config))
        model = getattr(transformers, cls_name)(config).eval()
        fuse_attention(model, layout_for(model))
        for name, m in modules.items():
            q = QuantLinear(m.in_features, m.out_features, m.bias, m.mode, m.activation, m.outliers)
            model.set_submodule(name, q)
            if m.absorbs:
                model.set_submodule(m.absorbs, nn.Identity())
    return model


def _check_modules(model: nn.Module, record: QuantizationRecord, where: str) -> None:
    """Each quantized-module record names a GEMM site of this architecture with its true
    shape (the record's own field types were checked by QuantizationRecord.from_dict)."""
    layout = layout_for(model)
    sites = {s.name: s for s in find_sites(model, layout)}
    layers_path, _ = encoder_layers(model, layout)
    for name, rec in record.modules.items():
        w = f"{where}: module {name!r}"
        if name not in sites:
            raise SquantError(f"{w} is not a quantizable linear of {type(model).__name__}")
        site = sites[name]
        linear = linear_at(model, name)
        shape = (rec.in_features, rec.out_features)
        if shape != (linear.in_features, linear.out_features):
            raise SquantError(
                f"{w}: shape {shape} does not match the model's "
                f"{(linear.in_features, linear.out_features)}"
            )
        if rec.bias != (linear.bias is not None):
            raise SquantError(f"{w}: bias={rec.bias} does not match the model")
        # kind/layer may be absent in old records (parsed as "" / -1)
        kind_ok = rec.kind in ("", site.kind) and rec.layer in (-1, site.layer)
        if not kind_ok:
            raise SquantError(f"{w}: kind/layer do not match the model ({site.kind}, {site.layer})")
        expected = f"{layers_path}.{site.layer}.{layout.ffn_act}"
        if rec.absorbs is not None and (site.kind != "ffn_in" or rec.absorbs != expected):
            raise SquantError(
                f"{w}: absorbs {rec.absorbs!r}; only {expected!r} may be absorbed here"
            )


def _header(weights: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """Tensor name -> (shape, dtype) from the safetensors header, without reading the data."""
    try:
        with safetensors.safe_open(str(weights), "pt") as f:
            return {
                k: (tuple(f.get_slice(k).get_shape()), str(f.get_slice(k).get_dtype()))
                for k in f.keys()  # noqa: SIM118 (safe_open is not a mapping)
            }
    except (OSError, RuntimeError, safetensors.SafetensorError) as e:
        raise SquantError(f"cannot load {weights}: {first_line(e)}") from None


_SAFETENSORS_DTYPES = {
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.int32: "I32",
    torch.int64: "I64",
    torch.bool: "BOOL",
}


def _check_header(model: nn.Module, header: dict[str, Any], weights: Path) -> None:
    expected = model.state_dict(keep_vars=True)
    for key, (shape, dtype) in header.items():
        if key not in expected:
            raise SquantError(f"cannot load {weights}: unexpected tensor {key!r}")
        t = expected[key]
        want = (tuple(t.shape), _SAFETENSORS_DTYPES.get(t.dtype, str(t.dtype)))
        if (shape, dtype) != want:
            raise SquantError(
                f"cannot load {weights}: {key} is {dtype}{list(shape)}, the model needs "
                f"{want[1]}{list(want[0])}"
            )
    present = [expected[k] for k in header]
    for key, t in expected.items():  # a missing name must be a tied alias of a present one
        if key not in header and not any(t is p for p in present):
            raise SquantError(f"cannot load {weights}: missing tensor {key!r}")


def _check_values(model: nn.Module, where: Path) -> None:
    for name, module in model.named_modules():
        if isinstance(module, QuantLinear):
            multiplier = module.input_multiplier
            if module.outlier_index is not None:
                idx = module.outlier_index
                if idx.numel() and (
                    int(idx.min()) < 0
                    or int(idx.max()) >= module.in_features
                    or len(set(idx.tolist())) != idx.numel()
                ):
                    raise SquantError(
                        f"{where}: {name}.outlier_index must be distinct channels in "
                        f"[0, {module.in_features})"
                    )
                if bool((multiplier[idx] != 0).any()):
                    raise SquantError(
                        f"{where}: {name}.input_multiplier must be 0 on its outlier channels"
                    )
                keep = torch.ones_like(multiplier, dtype=torch.bool)
                keep[idx] = False
                multiplier = multiplier[keep]  # the others must be positive like any site's
            positive = {"weight_scale": module.weight_scale, "input_multiplier": multiplier}
            if module.mode == "static":
                positive["input_scale"] = module.input_scale
                zp = int(module.input_zero_point)
                if not int8.QMIN_A <= zp <= int8.QMAX_A:
                    raise SquantError(f"{where}: {name}.input_zero_point {zp} is outside [0, 255]")
            for key, t in positive.items():
                if not bool(torch.isfinite(t).all()) or not bool((t > 0).all()):
                    raise SquantError(
                        f"{where}: {name}.{key} has non-finite or non-positive values"
                    )
            if int(module.weight.min()) < int8.QMIN_W:
                raise SquantError(
                    f"{where}: {name}.weight holds -128 (squant weights are symmetric)"
                )
    for key, t in model.state_dict().items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise SquantError(f"{where}: tensor {key} holds NaN or infinite values")


def load(directory: str | Path) -> Any:
    """Rebuild a quantized model saved with squant.save(); eval mode, ready to run. A
    directory saved from a SentenceTransformer gives a SentenceTransformer back."""
    directory = Path(directory)
    meta = read_meta(directory)
    where = str(directory / CONFIG_FILE)
    hf_config = dict(_field(meta, "hf_config", dict, where))
    model_type = _field(hf_config, "model_type", str, f"{where}: hf_config")
    cls_name = _field(meta, "model_class", str, where)
    record = QuantizationRecord.from_dict(
        _field(meta, "quantization", dict, where), f"{where}: quantization"
    )
    if cls_name not in SUPPORTED_CLASSES.get(model_type, ()):
        raise SquantError(f"{directory}: model class {cls_name!r} is not one squant can rebuild")
    _check_config_sizes(hf_config, where)
    weights = directory / WEIGHTS_FILE
    if not weights.is_file():
        raise SquantError(f"{directory} has no {WEIGHTS_FILE}")

    try:
        skeleton = _build(cls_name, model_type, hf_config, {}, meta=True)
    except SquantError:
        raise
    except Exception as e:  # transformers rejects odd configs in many ways
        raise SquantError(f"{where}: cannot rebuild {cls_name} from hf_config ({e})") from None
    _check_modules(skeleton, record, where)
    modules = record.modules
    _check_header(
        _build(cls_name, model_type, hf_config, modules, meta=True), _header(weights), weights
    )

    model = _build(cls_name, model_type, hf_config, modules, meta=False)
    try:
        safetensors.torch.load_model(model, str(weights), strict=True)
    except (OSError, RuntimeError, safetensors.SafetensorError) as e:
        raise SquantError(f"cannot load {weights}: {first_line(e)}") from None
    _check_values(model, directory)
    use_attention_kind(model, record.config.attention)
    cast(Any, model).squant_info = record
    if sentence_transformer.is_sentence_transformer_dir(directory):
        return sentence_transformer.load(directory, model.eval())
    return model.eval()


def _config_kwargs(hf_config: dict[str, Any]) -> dict[str, Any]:
    # Keys that only describe where a config came from; the rest rebuilds it exactly.
    drop = {"model_type", "transformers_version", "_name_or_path", "auto_map"}
    return {k: v for k, v in hf_config.items() if k not in drop}
