"""What a long-running server process does about its memory: give freed heap pages back to
the OS (glibc malloc_trim), cap malloc's arenas, and move start-up objects out of the garbage
collector's sight. Used by the engine's workers, the model process and `squant serve`."""

from __future__ import annotations

import functools
from typing import Any


@functools.cache
def _libc() -> Any:
    """glibc through ctypes, or None where there is none (musl, macOS). Looked up once:
    find_library runs ldconfig, and the workers trim the heap every few seconds."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


def release_free_memory() -> bool:
    """Give the heap's free pages back to the OS (glibc malloc_trim). After a burst of big
    batches the freed activation memory otherwise stays in the process: RSS kept the burst's
    peak (+33%) long after it (docs/serving.md, overload). False without glibc."""
    libc = _libc()
    return bool(libc.malloc_trim(0)) if libc is not None else False


def freeze_startup_objects() -> int:
    """Move every object alive now (torch, transformers, the model, compiled graphs) out of
    the cyclic garbage collector's sight (gc.freeze) and return how many. They live as long
    as the server; a full collection walked them all: real MiniLM compiled, 914k objects,
    530-780 ms per full collection, a stall of the event loop and of the workers' Python
    under traffic. Afterwards a full collection scans only what requests allocated. Call it
    once loading and warm-up are done."""
    import gc

    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def limit_malloc_arenas(count: int) -> bool:
    """Cap glibc's malloc arenas (mallopt M_ARENA_MAX; arenas made later obey it). False
    where there is no glibc (musl, macOS): nothing to do there."""
    libc = _libc()
    if libc is None:
        return False
    try:
        return bool(libc.mallopt(-8, count))  # -8: M_ARENA_MAX in malloc.h
    except (OSError, AttributeError):
        return False
