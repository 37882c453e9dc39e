"""One timing run on this machine at a time (docs/hil.md "Faults and locks").

Timing runs — `experiments.validate`, `experiments.calibrate`, llama.cpp's cold runs (`hil.peer`) — share the cores,
the disk and the page cache with anything else that runs: two at once measured TTFTs 26-35 % above a solo run on
this 2-vCPU host, and each result looked normal. `timing_lock(what)` takes an exclusive `flock` on one file for the
whole machine (`/run/lock/edgellm-timing.lock`, or in the temp directory where /run/lock is not writable) for the
body; a second run prints one line `waiting for <pid>'s timing run (<what>) …` and waits for it (the kernel releases
the lock when its holder exits, SIGKILL included). The lock is re-entrant within a process (validate takes it around
a calibration and a peer's runs that take it again).

Parallel launchers (`hydra/launcher=joblib`, ray, submitit, …) would run a timing app's jobs side by side:
`parallel_launcher(app, argv)` is the one-line error the apps stop with before any work.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import tempfile
import threading
from pathlib import Path
from typing import Callable, Iterator

LOCK_NAME = "edgellm-timing.lock"
_depth = 0
_guard = threading.Lock()


def lock_path() -> Path:
    """/run/lock/edgellm-timing.lock where /run/lock is a writable directory, else in the temp directory."""
    run_lock = Path("/run/lock")
    if run_lock.is_dir() and os.access(run_lock, os.W_OK):
        return run_lock / LOCK_NAME
    return Path(tempfile.gettempdir()) / LOCK_NAME


def _holder(path: Path) -> str:
    try:
        text = path.read_text().strip()
    except OSError:
        return "another process"
    pid, _, what = text.partition(" ")
    return f"{pid}'s timing run ({what})" if pid.isdigit() else "another process's timing run"


@contextlib.contextmanager
def timing_lock(what: str, path: Path | None = None, log: Callable[[str], None] = lambda m: print(m, file=sys.stderr)
                ) -> Iterator[None]:
    """Hold the machine's timing lock for the body (module doc); waits for another holder with one line (`log`)."""
    global _depth
    with _guard:
        if _depth:
            _depth += 1
            reentered = True
        else:
            reentered = False
    if reentered:
        try:
            yield
        finally:
            with _guard:
                _depth -= 1
        return
    path = path or lock_path()
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except PermissionError:                 # another user's lock file: lock it, leave its holder line alone
        fd = os.open(path, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"waiting for {_holder(path)} to finish: timing runs on this machine take turns ({path})")
            fcntl.flock(fd, fcntl.LOCK_EX)
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()} {what}\n".encode(), 0)
        with _guard:
            _depth = 1
        try:
            yield
        finally:
            with _guard:
                _depth = 0
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
    finally:
        os.close(fd)                        # closing the descriptor releases the lock


PARALLEL_LAUNCHERS_OK = ("basic",)


def parallel_launcher(app: str, argv: list[str]) -> str | None:
    """The one-line error for a command line whose `hydra/launcher=<name>` is not the sequential basic launcher (it
    would run `app`'s timing jobs side by side), else None."""
    for a in argv:
        key, eq, val = a.partition("=")
        if eq and key.lstrip("+~") == "hydra/launcher" and val not in PARALLEL_LAUNCHERS_OK:
            return (f"hydra/launcher: {app} times cold runs, which must not share the machine; {val} runs jobs in "
                    f"parallel (drop hydra/launcher={val}: a sweep then runs its jobs one after the other)")
    return None
