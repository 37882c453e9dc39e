"""Close registered resources on SIGINT, SIGTERM and interpreter exit, then let the signal do what it did before.

While at least one object is registered, this module's handler is installed for SIGINT and SIGTERM (main thread only:
Python allows signal handlers nowhere else) and an atexit hook is armed. The handler closes every registered object
(last registered first), then chains to the handler it replaced: a Python callable is called (SIGINT's default raises
KeyboardInterrupt), SIG_IGN does nothing, SIG_DFL is restored and the signal re-sent, so the process still dies of
it. A second signal during the clean-up is swallowed (the clean-up must finish), and the chain runs once afterwards.
See docs/cluster.md ("Emulated cluster: plumbing", cleanup guarantees).
"""
from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from typing import Protocol

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Closeable(Protocol):
    def close(self) -> None: ...


_lock = threading.RLock()
_open: list[Closeable] = []
_prev: dict[int, object] = {}
_atexit_armed = False
_in_cleanup = False


def register(obj: Closeable) -> None:
    global _atexit_armed
    with _lock:
        if obj not in _open:
            _open.append(obj)
        if not _atexit_armed:
            atexit.register(close_all)
            _atexit_armed = True
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                if signal.getsignal(sig) is not _handler:
                    _prev[sig] = signal.getsignal(sig)
                    signal.signal(sig, _handler)


def unregister(obj: Closeable) -> None:
    with _lock:
        if obj in _open:
            _open.remove(obj)
        if not _open and threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                if signal.getsignal(sig) is _handler:     # someone else's handler on top of ours stays
                    signal.signal(sig, _prev.get(sig) or signal.SIG_DFL)


def close_all() -> None:
    """Close every registered object, newest first; an error in one does not stop the others."""
    with _lock:
        objs = list(reversed(_open))
    for obj in objs:
        try:
            obj.close()
        except Exception as e:      # clean-up must go on
            print(f"warning: cleanup of {obj!r} failed: {type(e).__name__}: {e}", file=sys.stderr)
        unregister(obj)


def _handler(signum, frame) -> None:
    global _in_cleanup
    if _in_cleanup:
        return
    prev = _prev.get(signum, signal.SIG_DFL)
    _in_cleanup = True
    try:
        close_all()
    finally:
        _in_cleanup = False
    if callable(prev) and prev is not _handler:
        prev(signum, frame)
    elif prev == signal.SIG_IGN:
        return
    else:                                   # SIG_DFL (or unknown): die of the signal as if we had never been here
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
