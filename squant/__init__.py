"""squant: SmoothQuant INT8 for BERT-family encoders on CPUs, with PyTorch alone."""

__version__ = "0.1.0"

from .compiler import CompileConfig, compile
from .config import SmoothQuantConfig
from .errors import SquantError
from .export import export, load_exported
from .quantize import quantize, smooth
from .serialization import load, save

__all__ = [
    "CompileConfig",
    "SmoothQuantConfig",
    "SquantError",
    "compile",
    "export",
    "load",
    "load_exported",
    "quantize",
    "save",
    "smooth",
]
