"""Where squant keeps what it builds once and reuses (compiled kernels, probe features):
$SQUANT_CACHE, else $XDG_CACHE_HOME/squant, else ~/.cache/squant. One root, so a container
mounts one volume and a user clears one directory."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    env = os.environ.get("SQUANT_CACHE")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "squant"
