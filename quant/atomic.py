"""Atomic file writes: write to a temp file in the same directory, fsync, rename. Nothing is ever half-written.

Lives in `quant/` because it is the lowest Python layer every other package may import (dependency order:
docs/design.md §2).
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any, BinaryIO, Iterator

# The temp file of a write to <dir>/<name> is <dir>/.<name>.<random>.tmp (mkstemp's random part: [a-z0-9_]); a killed
# writer leaves it behind, so run directories recognise (and clean) their partial files by this pattern.
TMP_RE = re.compile(r"^\..+\.[A-Za-z0-9_]+\.tmp$")


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike) -> Iterator[BinaryIO]:
    """Binary file handle on a temp file beside `path`; on a clean exit it is fsynced and renamed onto `path`,
    on any exception it is removed and `path` is untouched."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())               # mkstemp makes 0600; give the file normal permissions
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def fsync_file(path: str | os.PathLike) -> None:
    """Flush a file written by someone else (a converter, a C library) to the disk before it is renamed into place."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    with atomic_open(path) as f:
        f.write(data)
    return Path(path)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=json_default) + "\n")


def json_default(o: Any) -> Any:
    """`json.dumps(default=...)` for NumPy scalars/arrays and Enums."""
    import numpy as np

    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if hasattr(o, "value"):  # Enum
        return o.value
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
