"""squant: SmoothQuant INT8 for BERT-family encoders on CPUs, with PyTorch alone."""

from . import models, sentence_transformer, variants
from .compiler import CompileConfig, compile
from .config import SmoothQuantConfig
from .errors import SquantError
from .export import ExportConfig, export, load_exported, load_packaged
from .quantize import smooth
from .quantize_api import quantize
from .serialization import load, save
from .version import __version__ as __version__

__all__ = [
    "CompileConfig",
    "ExportConfig",
    "SmoothQuantConfig",
    "SquantError",
    "compile",
    "export",
    "load",
    "load_exported",
    "load_packaged",
    "models",
    "quantize",
    "save",
    "sentence_transformer",
    "smooth",
    "variants",
]
