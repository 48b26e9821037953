"""Save and load quantized models as safetensors + JSON: no pickle, no code from the file.

Layout of a saved directory:
    squant.json        format version, model class, the HF config, quantization settings and
                       the list of quantized modules (shapes, modes)
    model.safetensors  every tensor (int8 weights, scales, the float rest)
    tokenizer files    when a tokenizer was given
Loading rebuilds the model from an allow-listed transformers class named in the JSON, re-does
the same module surgery with empty int8 modules, then loads the tensors strictly.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
import transformers
from torch import nn

from . import __version__
from .errors import SquantError
from .mappings import SUPPORTED_CLASSES, layout_for
from .qlinear import QuantLinear
from .quantize import fuse_attention

FORMAT = "squant"
FORMAT_VERSION = 1
CONFIG_FILE = "squant.json"
WEIGHTS_FILE = "model.safetensors"


def save(model: nn.Module, directory: str | Path, tokenizer: Any = None) -> Path:
    """Write a model returned by squant.quantize() to `directory` (created if missing)."""
    info = getattr(model, "squant_info", None)
    if info is None:
        raise SquantError("this model was not quantized by squant.quantize(); nothing to save")
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise SquantError(f"{directory} exists and is not a directory")
    directory.mkdir(parents=True, exist_ok=True)
    meta = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "squant_version": __version__,
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "model_class": type(model).__name__,
        "hf_config": model.config.to_dict(),
        "quantization": info,
    }
    safetensors.torch.save_model(model, str(directory / WEIGHTS_FILE), metadata={"format": "pt"})
    (directory / CONFIG_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True))
    if tokenizer is not None:
        tokenizer.save_pretrained(str(directory))
    return directory


def read_meta(directory: str | Path) -> dict[str, Any]:
    path = Path(directory) / CONFIG_FILE
    if not Path(directory).is_dir():
        raise SquantError(f"{directory} is not a directory")
    if not path.is_file():
        raise SquantError(f"{directory} has no {CONFIG_FILE}: not a model saved by squant.save()")
    try:
        meta = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SquantError(f"{path} is not valid JSON ({e}); the file is corrupt") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise SquantError(f"{path} is not a squant model description")
    if meta.get("format_version") != FORMAT_VERSION:
        raise SquantError(
            f"{path} has format version {meta.get('format_version')}; this squant reads "
            f"{FORMAT_VERSION}"
        )
    return meta


def load(directory: str | Path) -> nn.Module:
    """Rebuild a quantized model saved with squant.save(); eval mode, ready to run."""
    directory = Path(directory)
    meta = read_meta(directory)
    try:
        hf_config = dict(meta["hf_config"])
        model_type = hf_config["model_type"]
        cls_name = meta["model_class"]
        modules = meta["quantization"]["modules"]
    except (KeyError, TypeError) as e:
        raise SquantError(f"{directory / CONFIG_FILE} is missing field {e}") from None
    if cls_name not in SUPPORTED_CLASSES.get(model_type, ()):
        raise SquantError(f"{directory}: model class {cls_name!r} is not one squant can rebuild")
    weights = directory / WEIGHTS_FILE
    if not weights.is_file():
        raise SquantError(f"{directory} has no {WEIGHTS_FILE}")

    config = transformers.AutoConfig.for_model(model_type, **_config_kwargs(hf_config))
    model = getattr(transformers, cls_name)(config).eval()
    fuse_attention(model, layout_for(model))
    for name, m in modules.items():
        activation = m.get("activation", "none")
        q = QuantLinear(m["in_features"], m["out_features"], m["bias"], m["mode"], activation)
        model.set_submodule(name, q)
        if m.get("absorbs"):
            model.set_submodule(m["absorbs"], nn.Identity())
    try:
        safetensors.torch.load_model(model, str(weights), strict=True)
    except (OSError, RuntimeError, safetensors.SafetensorError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SquantError(f"cannot load {weights}: {first}") from None
    model.squant_info = meta["quantization"]
    return model.eval()


def _config_kwargs(hf_config: dict[str, Any]) -> dict[str, Any]:
    # Keys that only describe where a config came from; the rest rebuilds it exactly.
    drop = {"model_type", "transformers_version", "_name_or_path", "auto_map"}
    return {k: v for k, v in hf_config.items() if k not in drop}
