"""Host memory during hardware-in-the-loop runs: hold the guest's free page reporting (docs/hil.md "Host memory").

This host is a virtual machine whose virtio-balloon reports free memory (VIRTIO_BALLOON_F_REPORTING, feature bit 5): the
guest kernel tells the hypervisor about free blocks of >= 2^`page_reporting_order` pages, and the hypervisor takes their
backing away. The next first touch of such a page costs a hypervisor fault on top of the guest's own fault and zeroing.
Measured on the host (docs/hil.md "Host memory"; a C loop writing one byte per 4 KiB page of a fresh 1 GiB anonymous
mapping, 4-5 repeats, the previous 1 GiB freed just before):

| next touch | reported meanwhile | first touch |
|---|---|---|
| right away | 0-8 MiB | 0.48-0.51 ns/B |
| 3 s later | 270-500 MiB | 2.1-2.8 ns/B |
| 3 s later, reporting held (order 11) | 0 MiB | 0.42-0.51 ns/B |

So a cold run's fresh tensors (the unpack phase) and page-cache pages (the load phase) cost 1x or ~5x depending on how
long ago memory was freed — by the previous run, by llama.cpp's run, by an eviction — which moved the 1B model's unpack
phase between 0.51-0.57 s and 1.34-1.53 s from one series of runs to another. A phone has no hypervisor: its fresh pages
cost the kernel's fault and zeroing only, which is the held state here.

`hold(mode, prefault_bytes, change_system=False)` is a context manager:
- "hold": touches and frees `prefault_bytes` of anonymous memory, on huge pages and on 4 KiB pages (`prefault`: so
  the free blocks the runs are given next are backed); with `change_system` (the user's opt-in, off by default:
  the state then says so) it also sets `page_reporting_order` to the largest value the kernel accepts (11 on this
  kernel, whose largest free block is order 10: nothing new is reported) and on exit (SIGTERM included) restores the
  order found by the first holder. Holders in several processes share one record (`STATE`, under outputs/: the
  original order and their pids; the last one out restores). A record whose holders are all dead (a SIGKILLed run)
  is restored at the start of the next hold (`restore_stale`) and by `python -m experiments.cleanup`.
- "as_is": changes nothing (measure the VM as it is).
Without the parameter (no reporting balloon, or another kernel) both change nothing; without permission to write it,
"hold" says so once and measures as is. `HostMemory.metrics()` says which, with the MiB the guest reported during the
hold (measured: this kernel's `reported_kib` counter; None on kernels without it) and the prefault's time.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import mmap
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from quant.atomic import atomic_write_json

PARAMS = Path("/sys/module/page_reporting/parameters")
# the record of a changed system setting: the value found before and the pids holding it (docs/hil.md "Faults and
# locks"); a record left by a killed holder is restored at the next hold and by `python -m experiments.cleanup`
STATE = Path(__file__).resolve().parents[1] / "outputs" / "hil" / "system-state.json"
MODES = ("hold", "as_is")
MAX_ORDER_TRIED = 16            # orders tried from here down: the first one the kernel accepts holds reporting
GIB = 1 << 30


@dataclass
class HostMemory:
    """What `hold` did (module doc). `state`: "held", "as is", "absent" or "not held: <why>"."""
    mode: str
    state: str
    order_before: int | None = None
    order_held: int | None = None
    reported_kib_start: int | None = None
    prefault_bytes: int = 0
    prefault_s: float = 0.0
    params: Path = PARAMS

    def reported_mib(self) -> float | None:
        """MiB the guest reported to the hypervisor since the hold began (measured; None without the counter)."""
        now = _read_int(self.params / "reported_kib")
        if now is None or self.reported_kib_start is None:
            return None
        return (now - self.reported_kib_start) / 1024.0

    def describe(self) -> str:
        if self.state == "held":
            return f"held (page_reporting_order {self.order_before} -> {self.order_held})"
        if self.state == "as is" and self.order_before is not None:
            return f"as is (page_reporting_order {self.order_before})"
        return self.state

    def metrics(self) -> dict[str, object]:
        """host_page_reporting (what was done), host_pages_reported_mib (measured), host_prefault_s / _bytes."""
        m: dict[str, object] = {"host_page_reporting": self.describe(), "host_prefault_bytes": self.prefault_bytes,
                                "host_prefault_s": self.prefault_s}
        mib = self.reported_mib()
        if mib is not None:
            m["host_pages_reported_mib"] = mib
        return m


_current: HostMemory | None = None      # this process's hold (nested holds share it)


OFF = "not held: change_system=false (the runs change no system setting; change_system=true lets them hold it)"


@contextlib.contextmanager
def hold(mode: str = "hold", prefault_bytes: int = 0, params: Path = PARAMS, state_file: Path = STATE,
         log=lambda msg: print(msg, file=sys.stderr), change_system: bool = False) -> Iterator[HostMemory]:
    """Hold free page reporting (or not: `mode="as_is"`) for the body; see the module doc. The order is written
    only with `change_system` (the user's opt-in; otherwise the state says so and only the prefault runs). A setting
    a killed holder left changed is restored first (`restore_stale`)."""
    global _current
    if mode not in MODES:
        raise ValueError(f"host_memory: must be one of {', '.join(MODES)} (got {mode!r})")
    if _current is not None and _current.params == params:       # nested: one hold per process, the outer one's
        if _current.state in ("held", OFF) and prefault_bytes > _current.prefault_bytes:
            _current.prefault_s += prefault(prefault_bytes)
            _current.prefault_bytes = prefault_bytes
        yield _current
        return
    restore_stale(params, state_file, log)
    if mode == "hold" and not change_system:
        mem = HostMemory(mode, OFF, order_before=_read_int(params / "page_reporting_order"),
                         reported_kib_start=_read_int(params / "reported_kib"), params=params)
    else:
        mem = _enter(mode, params, state_file, log)
    _current = mem
    prev = None
    if mem.state == "held" and threading.current_thread() is threading.main_thread():
        def on_term(signum, frame):                 # SIGTERM: an exception, so the order is restored below
            raise SystemExit(128 + signum)
        prev = signal.signal(signal.SIGTERM, on_term)
    try:
        if mem.state in ("held", OFF) and prefault_bytes > 0:
            mem.prefault_s, mem.prefault_bytes = prefault(prefault_bytes), prefault_bytes
        yield mem
    finally:
        _current = None
        if mem.state == "held":
            _leave(params, state_file)
        if prev is not None:
            signal.signal(signal.SIGTERM, prev)


def restore_stale(params: Path = PARAMS, state_file: Path = STATE, log=lambda msg: print(msg, file=sys.stderr),
                  dry_run: bool = False) -> str | None:
    """Restore `page_reporting_order` from the record when no holder in it is alive (a SIGKILLed run's); one line
    (`log`) and that line returned, None when there was nothing to restore. `dry_run`: say, change nothing."""
    if not state_file.is_file():
        return None
    with _locked_state(state_file) as st:
        if not st or _live_holders(st):
            return None
        before, dead = st.get("order_before"), st.get("holders", [])
        if not dry_run:
            st.clear()                               # the record goes (written back empty: deleted)
        if not isinstance(before, int):
            return None
        p = params / "page_reporting_order"
        line = (f"{p}: {'would restore' if dry_run else 'restored'} {before} (was {_read_int(p)}; left changed by "
                f"a run that ended without restoring it, pid {', '.join(map(str, dead)) or '?'})")
        if not dry_run:
            try:
                _write_order(p, before)
            except OSError as e:
                line = f"{p}: could not restore {before} ({e.strerror}); restore it as root: echo {before} > {p}"
        log(line)
        return line


def prefault(nbytes: int) -> float:
    """Touch `nbytes` of fresh anonymous memory (one write per page) and free it, twice: through a mapping advised
    MADV_HUGEPAGE (the kernel then backs it with 2 MiB blocks, the blocks the runs' huge-page buffers are given next)
    and through a plain one (4 KiB pages: page cache, small buffers); wall seconds taken. A 4 KiB-only prefault left the
    2 MiB blocks unbacked: measured on an AMD EPYC VM (docs/hil.md "Host memory"), reporting let run for 6 s then held,
    0.4 GiB prefaulted, then ten rounds of 120 MiB of fresh huge-page buffers: first touch 0.4-0.9 GB/s in the first two
    rounds after a 4 KiB prefault (0.19-0.21 s: it was given pages that were backed already) against 11.3-11.6 GB/s in
    every round after a huge-page one (0.87-0.93 s)."""
    import numpy as np

    t0 = time.perf_counter()
    for huge in (True, False):
        m = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        try:
            if huge and hasattr(mmap, "MADV_HUGEPAGE"):
                m.madvise(mmap.MADV_HUGEPAGE)
            a = np.frombuffer(m, dtype=np.uint8)
            a[::mmap.PAGESIZE] = 1
            del a
        finally:
            m.close()
    return time.perf_counter() - t0


def footprint_bytes(params: int, bits: int, extra_bytes: int = 0, floor: int = 256 << 20) -> int:
    """Memory a host run touches, for `prefault`: twice (packed file's page cache at `bits` + INT8 tensors + margin)
    plus `extra_bytes` (the peer's GGUF), at least `floor`, at most half the memory available now."""
    want = max(floor, int(2 * params * (1 + bits / 8)) + extra_bytes)
    return min(want, _available_bytes() // 2)


def _available_bytes() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 4 * GIB


def _read_int(p: Path) -> int | None:
    try:
        return int(p.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


@contextlib.contextmanager
def _locked_state(state_file: Path) -> Iterator[dict]:
    """The shared state ({"order_before", "holders"}; {} when nobody holds) under an exclusive lock; the dict as
    left by the body is written back (deleted when empty)."""
    state_file.parent.mkdir(parents=True, exist_ok=True)
    with open(state_file.with_suffix(".lock"), "a") as lk:
        fcntl.flock(lk, fcntl.LOCK_EX)
        try:
            st = json.loads(state_file.read_text())
            if not isinstance(st, dict):
                st = {}
        except (OSError, ValueError):
            st = {}
        yield st
        if st.get("holders"):
            atomic_write_json(state_file, st)
        else:
            with contextlib.suppress(FileNotFoundError):
                state_file.unlink()


def _live_holders(st: dict, but: int | None = None) -> list[int]:
    """The state's holder pids that still run (other than `but`)."""
    from hil.calibrate_reads import pid_alive

    return [p for p in st.get("holders", []) if isinstance(p, int) and p != but and pid_alive(p)]


def _write_order(p: Path, value: int) -> None:
    with open(p, "w") as f:
        f.write(f"{value}\n")


def _enter(mode: str, params: Path, state_file: Path, log) -> HostMemory:
    order_p = params / "page_reporting_order"
    now = _read_int(order_p)
    if now is None:
        return HostMemory(mode, "absent", params=params)
    start = _read_int(params / "reported_kib")
    if mode == "as_is":
        return HostMemory(mode, "as is", order_before=now, reported_kib_start=start, params=params)
    with _locked_state(state_file) as st:
        holders = _live_holders(st)
        before = st.get("order_before") if isinstance(st.get("order_before"), int) else now
        held, why = None, ""
        for v in range(MAX_ORDER_TRIED, before, -1):
            try:
                _write_order(order_p, v)
            except OSError as e:
                if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
                    why = f"no permission to write {order_p} ({e.strerror})"
                    break
                continue                                    # EINVAL: above the kernel's largest order
            held = v
            break
        if held is None:
            why = why or f"{order_p} accepts no order above {before}"
            log(f"host memory: free page reporting not held: {why}; measuring the VM as it is")
            st.update(order_before=before, holders=holders)     # no live holder left: the state file goes
            return HostMemory(mode, f"not held: {why}", order_before=before, reported_kib_start=start,
                              params=params)
        st.update(order_before=before, holders=holders + [os.getpid()])
    return HostMemory(mode, "held", order_before=before, order_held=held, reported_kib_start=start, params=params)


def _leave(params: Path, state_file: Path) -> None:
    with _locked_state(state_file) as st:
        holders = _live_holders(st, but=os.getpid())
        if holders:
            st["holders"] = holders
            return
        before = st.get("order_before")
        st.clear()
        if isinstance(before, int):
            with contextlib.suppress(OSError):
                _write_order(params / "page_reporting_order", before)
