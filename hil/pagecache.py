"""Page-cache control for cold runs on this host (docs/hil.md): evict a file, and measure how much of it is resident.

A cold start reads the model from "flash" (this host's disk) only if the file's pages are not in the page cache.
`/proc/sys/vm/drop_caches` is not writable here, so each cold run evicts its own files with
`posix_fadvise(POSIX_FADV_DONTNEED)` (after `fsync`, so dirty pages of a freshly written file can be dropped) and checks
the result with `mincore(2)`: `resident_fraction` is 0.0 for a fully evicted file.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
from pathlib import Path

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
_libc.mincore.restype = ctypes.c_int
PAGE = mmap.PAGESIZE


def evict(path: str | Path) -> None:
    """Drop `path`'s pages from the page cache (clean pages; dirty ones are written back first)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def resident_pages(path: str | Path):
    """Per page of `path`: 1 if it is in the page cache (mincore(2)), as a uint8 array (empty for an empty file)."""
    import numpy as np

    size = os.path.getsize(path)
    n = (size + PAGE - 1) // PAGE
    vec = np.zeros(n, dtype=np.uint8)
    if size == 0:
        return vec
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ) as m:
        view = np.frombuffer(m, dtype=np.uint8)          # no copy, no page touched: only the address is used
        rc = _libc.mincore(ctypes.c_void_p(view.ctypes.data), ctypes.c_size_t(size), vec.ctypes.data)
        del view                                         # release the buffer export before the mmap closes
        if rc != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"mincore({path}): {os.strerror(err)}")
    return vec & 1


def resident_fraction(path: str | Path) -> float:
    """Fraction (0..1) of `path`'s pages in the page cache, from mincore(2); 0.0 for an empty file."""
    vec = resident_pages(path)
    return float(vec.sum()) / vec.size if vec.size else 0.0


EVICT_TRIES = 3     # evictions before a cold run: another process reading the same file re-fills the cache


def evict_cold(path: str | Path, tries: int = EVICT_TRIES) -> float:
    """Evict `path` up to `tries` times until none of it is cached; the resident fraction left (0.0: cold)."""
    frac = resident_fraction(path)
    for _ in range(tries):
        evict(path)
        frac = resident_fraction(path)
        if frac == 0.0:
            break
    return frac
