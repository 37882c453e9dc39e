"""CPU-speed emulation for one emulated device: a cpu cgroup whose CFS bandwidth quota is `cores` × period.

Voltron (§4, heterogeneous devices) needs devices of different compute speed on one host; a CFS quota of `cores` ×
`period` µs per `period` µs caps a device's worker at `cores` CPUs' worth of time (0.5 = half of one core, 1.5 =
one and a half cores). Both cgroup interfaces are supported and chosen at run time from /proc/self/mounts:

- v1 (a `cgroup` mount with the `cpu` controller, e.g. /sys/fs/cgroup/cpu): `cpu.cfs_period_us` + `cpu.cfs_quota_us`
  (-1 = unlimited);
- v2 (a `cgroup2` mount whose `cgroup.controllers` lists `cpu`): `cpu.max` = "<quota> <period>" ("max" = unlimited),
  after `+cpu` is enabled in the mount root's `cgroup.subtree_control`.

Groups are made directly below the hierarchy root (`<root>/<name>`); `close()` moves any task still inside back to the
root and removes the directory. The memory budget of a device is enforced by its worker, not by a cgroup.
"""
from __future__ import annotations

import contextlib
import errno
import math
import os
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path

PERIOD_US = 100_000          # µs, CFS period (the kernel default); quota = cores × period
MIN_QUOTA_US = 1_000         # µs, the kernel's lower bound for a CFS quota
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")


@dataclass(frozen=True)
class CpuController:
    version: int   # 1 (cgroup v1 `cpu` hierarchy) or 2 (unified hierarchy with the cpu controller)
    root: Path     # mount point of that hierarchy; groups are created directly below it


def detect_cpu_controller(mounts_text: str | None = None) -> CpuController | None:
    """The cgroup hierarchy that holds the cpu controller on this host, or None (no quota possible).

    A v1 `cpu` mount wins: while the cpu controller is bound to v1 it cannot be enabled in v2."""
    if mounts_text is None:
        try:
            mounts_text = Path("/proc/self/mounts").read_text()
        except OSError:
            return None
    v2: list[Path] = []
    for line in mounts_text.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        mnt, fstype, opts = Path(parts[1]), parts[2], parts[3].split(",")
        if fstype == "cgroup" and "cpu" in opts:
            return CpuController(1, mnt)
        if fstype == "cgroup2":
            v2.append(mnt)
    for mnt in v2:
        with contextlib.suppress(OSError):
            if "cpu" in (mnt / "cgroup.controllers").read_text().split():
                return CpuController(2, mnt)
    return None


def quota_us(cores: float | None, period_us: int = PERIOD_US) -> int:
    """CFS quota in µs for `cores` CPUs' worth of time per period; -1 = unlimited (cores None)."""
    if cores is None:
        return -1
    if not (isinstance(cores, (int, float)) and math.isfinite(cores) and cores > 0):
        raise ValueError(f"cpu_cores: must be a finite number > 0 (or None = unlimited), got {cores!r}")
    return max(MIN_QUOTA_US, int(round(cores * period_us)))


def cpu_max_line(cores: float | None, period_us: int = PERIOD_US) -> str:
    """The v2 `cpu.max` line for `cores`: "<quota> <period>" or "max <period>"."""
    q = quota_us(cores, period_us)
    return f"{'max' if q < 0 else q} {period_us}"


class CpuQuota:
    """A cpu cgroup `<root>/<name>` capped at `cores` CPUs; `add(pid)` puts a process in it; `close()` removes it.

    Use as a context manager or call `close()` (idempotent)."""

    def __init__(self, name: str, cores: float | None, *, period_us: int = PERIOD_US,
                 controller: CpuController | None = None):
        if not _NAME.match(name):
            raise ValueError(f"cgroup name: {name!r} must match {_NAME.pattern}")
        if not (isinstance(period_us, int) and 1_000 <= period_us <= 1_000_000):
            raise ValueError(f"period_us: must be an int in [1000, 1000000] µs, got {period_us!r}")
        self.controller = controller or detect_cpu_controller()
        if self.controller is None:
            raise RuntimeError("no cgroup hierarchy with the cpu controller is mounted (looked in /proc/self/mounts)")
        self.name = name
        self.period_us = period_us
        self.path = self.controller.root / name
        self._closed = False
        if self.controller.version == 2:
            _enable_v2_cpu(self.controller.root)
        self.path.mkdir(exist_ok=True)
        try:
            self.set_cores(cores)
        except BaseException:
            self.close()
            raise

    # -- settings ---------------------------------------------------------------------------------------------------
    def set_cores(self, cores: float | None) -> None:
        """Change the quota (the device's CPU speed) at run time; None = unlimited."""
        q = quota_us(cores, self.period_us)
        if self.controller.version == 1:
            # shrink the quota first so that a new period never makes the old quota exceed a limit
            _write(self.path / "cpu.cfs_quota_us", "-1")
            _write(self.path / "cpu.cfs_period_us", str(self.period_us))
            _write(self.path / "cpu.cfs_quota_us", str(q))
        else:
            _write(self.path / "cpu.max", cpu_max_line(cores, self.period_us))
        self.cores = cores

    @property
    def procs_file(self) -> Path:
        """Writing a pid here moves that process (all its threads) into the group."""
        return self.path / "cgroup.procs"

    def add(self, pid: int) -> None:
        _write(self.procs_file, str(int(pid)))

    def pids(self) -> list[int]:
        return read_pids(self.path)

    def stat(self) -> dict[str, int]:
        """`cpu.stat` counters (v1: nr_periods, nr_throttled, throttled_time ns; v2: usage_usec, throttled_usec, …)."""
        out: dict[str, int] = {}
        with contextlib.suppress(OSError):
            for line in (self.path / "cpu.stat").read_text().splitlines():
                k, _, v = line.partition(" ")
                with contextlib.suppress(ValueError):
                    out[k] = int(v)
        return out

    # -- lifetime -----------------------------------------------------------------------------------------------------
    def close(self) -> None:
        """Move remaining tasks back to the root group, then remove the group. Idempotent."""
        if self._closed:
            return
        self._closed = True
        remove_group(self.path, self.controller.root, kill=False)

    def __enter__(self) -> CpuQuota:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"CpuQuota({self.name!r}, cores={self.cores}, v{self.controller.version}, {self.path})"


# -- helpers shared with stale-set cleanup ---------------------------------------------------------------------------
def read_pids(path: Path) -> list[int]:
    try:
        return [int(x) for x in (path / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def remove_group(path: Path, root: Path, *, kill: bool, timeout_s: float = 2.0) -> bool:
    """Empty the group at `path` (SIGKILL its tasks if `kill`, else move them to `root`) and rmdir it.

    Returns True when the directory is gone. Never raises for a group that is already gone."""
    deadline = time.monotonic() + timeout_s
    while path.exists():
        for pid in read_pids(path):
            with contextlib.suppress(OSError):
                if kill:
                    os.kill(pid, signal.SIGKILL)
                else:
                    _write(root / "cgroup.procs", str(pid))
        try:
            path.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError as e:
            if e.errno not in (errno.EBUSY, errno.ENOTEMPTY) or time.monotonic() > deadline:
                return False
            time.sleep(0.02)     # exiting tasks leave the group asynchronously
    return True


def list_groups(controller: CpuController, pattern: re.Pattern[str]) -> list[Path]:
    """Groups directly below the hierarchy root whose name matches `pattern`."""
    try:
        return sorted(p for p in controller.root.iterdir() if p.is_dir() and pattern.match(p.name))
    except OSError:
        return []


def _enable_v2_cpu(root: Path) -> None:
    ctl = root / "cgroup.subtree_control"
    with contextlib.suppress(OSError):
        if "cpu" in ctl.read_text().split():
            return
    _write(ctl, "+cpu")


def _write(path: Path, text: str) -> None:
    # cgroup files take one write() of the whole value; no temp file / rename (not a regular file system)
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
