"""What a directory holds, decided once: a deploy directory (`squant export`: an
AOTInductor package), a quantized directory (`squant quantize` / `squant.save`), or a float
Hugging Face checkpoint. Serving and exporting read the kind here and then take one path per
kind, instead of each testing marker files on its own."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from torch import nn

from ..runtime.export import MANIFEST
from .serialization import CONFIG_FILE

SourceKind = Literal["deploy", "quantized", "float"]


def source_kind(path: str | Path) -> SourceKind:
    path = Path(path)
    if (path / MANIFEST).is_file():
        return "deploy"
    if (path / CONFIG_FILE).is_file():
        return "quantized"
    return "float"


def load_encoder(path: str | Path) -> nn.Module:
    """The encoder a quantized or float directory holds, ready to run, compile or export. Of a
    sentence-transformers model that is its inner Hugging Face model: its pooling and
    normalisation are read from the directory apart (sentence_settings)."""
    from .models import load_model
    from .sentence_transformer import inner_model, is_sentence_transformer
    from .serialization import load

    model = load(path) if source_kind(path) == "quantized" else load_model(path)
    return inner_model(model) if is_sentence_transformer(model) else model
