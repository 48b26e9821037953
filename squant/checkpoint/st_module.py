"""The module a saved sentence-transformers directory declares for its INT8 transformer.

squant writes `squant.st_module.Int8Transformer` as the type of module 0 in modules.json, so
plain sentence-transformers either refuses the directory with a message that names squant's
class (the default: a class outside sentence-transformers needs `trust_remote_code=True`) or,
given that and with squant installed, loads it through squant:

    SentenceTransformer("minilm-int8/", trust_remote_code=True)   # == squant.load("minilm-int8/")

It is not a module class of its own: `load` returns the transformer module of the
SentenceTransformer that squant.load rebuilds (a sentence-transformers Transformer around the
INT8 model). A separate module from sentence_transformer.py because it calls squant.load,
which imports that one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import SquantError


class Int8Transformer:
    """Loads the INT8 transformer of a local squant directory (see the module docstring)."""

    @classmethod
    def load(cls, model_name_or_path: str, subfolder: str = "", **kwargs: Any) -> Any:
        from .serialization import load

        directory = Path(model_name_or_path) / subfolder
        if not directory.is_dir():
            raise SquantError(
                f"{model_name_or_path} is not a local directory: squant loads INT8 "
                "sentence-transformers directories from disk (download it first)"
            )
        return load(directory)[0]
