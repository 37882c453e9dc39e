"""Whole-file integrity checks done once per file version (docs/hil.md "Faults and locks"): a packed model file's
CRC32s (`quant.pack.verify`) and a shipped GGUF's SHA-256 (`quant.gguf_file`) read every byte, which is too slow to
repeat before every run; a check that passed is remembered by the file's (resolved path, size, mtime_ns, ctime_ns,
inode), in this process and in `outputs/cache/verified_files.json`, so a file is verified again only when it changed
(any write moves its ctime, which no user can set back).
"""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Callable

from quant.atomic import atomic_write_json

CACHE = Path(__file__).resolve().parents[1] / "outputs" / "cache" / "verified_files.json"
_memo: dict[str, list] = {}
_lock = threading.Lock()


def _stamp(path: Path, kind: str) -> tuple[str, list]:
    st = path.stat()
    return f"{kind}:{path}", [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def verified_once(path: str | os.PathLike, kind: str, check: Callable[[Path], None], cache: Path | None = None
                  ) -> bool:
    """Run `check(path)` (it raises on a bad file) unless this version of the file passed the same `kind` of check
    before; True when it ran. A file that fails is never remembered."""
    p = Path(path).resolve()
    cache = cache or CACHE
    key, stamp = _stamp(p, kind)
    with _lock:
        if not _memo and cache.is_file():
            try:
                doc = json.loads(cache.read_text())
                _memo.update({k: v for k, v in doc.items() if isinstance(v, list)} if isinstance(doc, dict) else {})
            except (OSError, ValueError):
                pass
        if _memo.get(key) == stamp:
            return False
    check(p)
    if _stamp(p, kind)[1] != stamp:          # changed while it was read: not remembered, checked again next time
        return True
    with _lock:
        _memo[key] = stamp
        for k in [k for k in _memo if not os.path.exists(k.split(":", 1)[1])]:     # files gone (temp files, tests)
            del _memo[k]
        try:
            atomic_write_json(cache, _memo)
        except OSError:                      # a read-only checkout: the check is repeated, never skipped wrongly
            pass
    return True


def forget(path: str | os.PathLike) -> None:
    """Drop every remembered check of `path` in this process (tests; a file replaced in place)."""
    p = str(Path(path).resolve())
    with _lock:
        for k in [k for k in _memo if k.split(":", 1)[1] == p]:
            del _memo[k]
