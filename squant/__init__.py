"""squant: SmoothQuant INT8 for BERT-family encoders on CPUs, with PyTorch alone."""

__version__ = "0.1.0"

from .config import SmoothQuantConfig
from .errors import SquantError
from .quantize import quantize, smooth
from .serialization import load, save

__all__ = ["SmoothQuantConfig", "SquantError", "load", "quantize", "save", "smooth"]
