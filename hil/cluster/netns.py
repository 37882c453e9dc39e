"""The emulated cluster's network: one Linux network namespace per device, star-connected to a hub bridge, each
device's link shaped with a `tc tbf` token bucket (Voltron §3.2.3: Wi-Fi Direct bandwidth that varies with the RSSI and
links that drop; §5.1.1: devices connected via Wi-Fi Direct). Latency is NOT added here (netem is not available on
every kernel): `transport.RpcClient` adds it in user space. See docs/cluster.md ("Emulated cluster: plumbing").

Topology of one run with prefix P (e.g. `efc4242a`) and subnet 10.X.0.0/24::

    root ns (controller)                 ns P-hub                          ns P-d<i>
    Pr 10.X.0.254/24  <== veth ==>  Pc --+
                                         br0 (bridge)
                                    Ph<i> --+  <== veth ==>  Pd<i> 10.X.0.<i+1>/24

`set_link(i, rate, up)` puts a `tbf` root qdisc on both ends of device i's veth (Pd<i> egress = uplink, Ph<i> egress =
downlink) or removes it (rate None), and sets both ends up or down. The controller's own veth (Pr/Pc) is unshaped, so
controller <-> device i runs at device i's rate and device i <-> device j at min(rate_i, rate_j).

Every resource name starts with P = "efc<pid><letters>"; a JSON state file `<state_dir>/P.json` (owner pid + start
time, namespaces, root links, cgroups, worker pids, scratch paths) is written BEFORE anything is created, so
`cleanup_stale()` can remove every set whose owner is dead. Clean-up acts on these records only: a namespace, link or
cgroup whose name merely looks like ours is someone else's (the records live in /run, a tmpfs, and so do the network
namespaces: a reboot clears both), and a record's entries are removed only when they carry the record's own prefix.
"""
from __future__ import annotations

import contextlib
import fcntl
import gzip
import ipaddress
import itertools
import json
import math
import os
import re
import shutil
import signal
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

from hil.cluster import cgroup
from quant.atomic import atomic_write_json

NAME_PREFIX = "efc"                                           # every namespace / link / cgroup of ours starts so
_OWNED = re.compile(rf"^{NAME_PREFIX}(\d+)([a-z]+)")            # -> owner pid, run letters
IFNAMSIZ = 15                                                  # Linux interface-name limit (chars)
MTU_FRAME = 1514                                               # bytes, Ethernet frame for MTU 1500
QUEUE_S = 0.05                                                 # s of traffic the tbf queue holds beyond the burst
MIN_QUEUE_PKTS = 16                                            # frames, lower bound of that queue (slow links)
CONTROLLER_HOST = 254                                          # controller address 10.X.0.254
SUBNET_RANGE = range(100, 250)                                 # X candidates for 10.X.0.0/24
_state_lock = threading.Lock()


def state_dir() -> Path:
    """/run/edgellm-cluster when /run is writable (tmpfs: gone after a reboot, as are the namespaces), else /tmp."""
    for base in (Path("/run"), Path("/tmp")):
        if os.access(base, os.W_OK):
            return base / "edgellm-cluster"
    raise RuntimeError("neither /run nor /tmp is writable: nowhere to keep the cluster state file")


def have_tools() -> str | None:
    """None when this process can build a ClusterNet, else the reason why not (for test skips / errors)."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, tc, cgroups)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` (iproute2) not found on PATH"
    return None


# -- tbf parameters ----------------------------------------------------------------------------------------------------
def kernel_hz() -> int:
    """CONFIG_HZ of the running kernel from /proc/config.gz or /boot/config-*, else 100 (the conservative guess:
    a smaller HZ needs a larger burst)."""
    candidates = [Path("/proc/config.gz"), Path(f"/boot/config-{os.uname().release}")]
    for path in candidates:
        with contextlib.suppress(OSError, EOFError):
            text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
            m = re.search(r"^CONFIG_HZ=(\d+)$", text, re.M)
            if m:
                return int(m.group(1))
    return 100


@dataclass(frozen=True)
class TbfParams:
    rate_bps: int      # bit/s, token rate
    burst: int         # bytes, bucket size
    limit: int         # bytes, queue (bucket + backlog) size; frames beyond it are dropped

    def tc_args(self) -> list[str]:
        return ["tbf", "rate", f"{self.rate_bps}bit", "burst", str(self.burst), "limit", str(self.limit)]


def tbf_params(rate_bps: float, hz: int | None = None) -> TbfParams:
    """Token-bucket parameters for a link of `rate_bps` bit/s, sensible from ~1 Mbit/s to ~10 Gbit/s.

    burst = max(rate/HZ, 2 frames): tokens for one timer tick of traffic, so the shaper can keep the rate even when
            it is woken only once per tick, and never smaller than two full frames (a frame larger than the bucket
            is dropped). At 1 Mbit/s and HZ 250 that is 3028 B; at 1 Gbit/s 500 kB.
    limit = burst + max(QUEUE_S × rate, MIN_QUEUE_PKTS frames): a 50 ms backlog (a Wi-Fi driver's queue, enough for
            TCP to stay at the rate on a sub-ms RTT) but at least 16 frames on slow links.
    GSO super-frames larger than the bucket are segmented by tbf itself."""
    if not (isinstance(rate_bps, (int, float)) and math.isfinite(rate_bps) and 8_000 <= rate_bps <= 100e9):
        raise ValueError(f"rate_bps: must be in [8e3, 1e11] bit/s (or None = unshaped), got {rate_bps!r}")
    hz = hz or kernel_hz()
    rate_Bps = rate_bps / 8.0
    burst = max(math.ceil(rate_Bps / hz), 2 * MTU_FRAME)
    limit = burst + max(math.ceil(rate_Bps * QUEUE_S), MIN_QUEUE_PKTS * MTU_FRAME)
    return TbfParams(int(round(rate_bps)), burst, limit)


# -- process helpers ---------------------------------------------------------------------------------------------------
def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise RuntimeError(f"`{' '.join(argv)}` failed ({r.returncode}): {r.stderr.strip() or r.stdout.strip()}")
    return r


def proc_start_time(pid: int) -> int | None:
    """Start time of `pid` in clock ticks since boot (field 22 of /proc/<pid>/stat), None if gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    if fields[0] in ("Z", "X"):            # exited, not yet reaped: as good as dead
        return None
    return int(fields[19])


def pid_alive(pid: int, start_time: int | None = None) -> bool:
    st = proc_start_time(pid)
    return st is not None and (start_time is None or st == start_time)


def _netns_list() -> list[str]:
    r = _run("ip", "netns", "list", check=False)
    return [line.split()[0] for line in r.stdout.splitlines() if line.strip()]


def _netns_pids(ns: str) -> list[int]:
    r = _run("ip", "netns", "pids", ns, check=False)
    return [int(x) for x in r.stdout.split() if x.isdigit()]


def _root_links() -> list[str]:
    r = _run("ip", "-o", "link", "show", check=False)
    names = []
    for line in r.stdout.splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            names.append(parts[1].strip().split("@")[0])
    return names


def _kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


# -- state files -----------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _locked(sdir: Path):
    """Serialise allocation and stale-set removal between processes (flock) and threads."""
    sdir.mkdir(parents=True, exist_ok=True)
    with _state_lock, open(sdir / ".lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _read_states(sdir: Path) -> list[tuple[Path, dict]]:
    out = []
    for path in sorted(sdir.glob(f"{NAME_PREFIX}*.json")):
        try:
            out.append((path, json.loads(path.read_text())))
        except (OSError, ValueError):
            out.append((path, {}))        # torn/empty: owner unknown -> treated as dead below
    return out


_PREFIX = re.compile(rf"^{NAME_PREFIX}\d+[a-z]+$")


def _own_entries(state: dict, prefix: str) -> dict:
    """The entries of a state record that are this project's: names (namespaces, root links, cgroups, scratch
    directories' base names) that start with the record's prefix, pids with a recorded start time; anything else in
    a record (hand-edited, or torn) is ignored rather than removed."""
    if not isinstance(prefix, str) or not _PREFIX.match(prefix):
        return {}

    def names(k: str) -> list[str]:
        v = state.get(k, [])
        return [x for x in v if isinstance(x, str) and x.startswith(prefix)] if isinstance(v, list) else []

    pids = [p for p in state.get("pids", []) if isinstance(p, list) and len(p) == 2
            and all(isinstance(x, int) and not isinstance(x, bool) for x in p)] \
        if isinstance(state.get("pids"), list) else []
    paths = [p for p in state.get("paths", []) if isinstance(p, str) and Path(p).is_absolute()
             and Path(p).name.startswith(prefix)] if isinstance(state.get("paths"), list) else []
    return {"namespaces": names("namespaces"), "root_links": names("root_links"), "cgroups": names("cgroups"),
            "pids": pids, "paths": paths}


def _teardown(state: dict) -> None:
    """Remove everything a state record lists; tolerant of anything already gone. Order: processes, cgroups,
    links, namespaces, scratch paths. Only a pid whose start time matches the record is killed (never a recycled
    pid)."""
    for pid, st in state.get("pids", []):
        if st is not None and pid_alive(pid, st):
            _kill([pid])
    for ns in state.get("namespaces", []):
        _kill(_netns_pids(ns))
    ctl = cgroup.detect_cpu_controller()
    if ctl is not None:
        for name in state.get("cgroups", []):
            cgroup.remove_group(ctl.root / name, ctl.root, kill=True)
    existing = set(_root_links())
    for link in state.get("root_links", []):
        if link in existing:
            _run("ip", "link", "del", link, check=False)
    present = set(_netns_list())
    for ns in reversed(state.get("namespaces", [])):
        if ns in present:
            _run("ip", "netns", "del", ns, check=False)
    for p in state.get("paths", []):
        shutil.rmtree(p, ignore_errors=True)


def stale_records(sdir: Path | None = None) -> list[tuple[Path, dict]]:
    """(state file, the record's own entries) of every cluster set on this host whose owner process is dead."""
    sdir = sdir or state_dir()
    out = []
    for path, st in _read_states(sdir):
        pid, start = st.get("pid"), st.get("start_time")
        if isinstance(pid, int) and pid_alive(pid, start):
            continue
        out.append((path, _own_entries(st, path.stem)))
    return out


def cleanup_stale(sdir: Path | None = None) -> list[str]:
    """Remove every cluster set whose owner process is dead, from the state records only (`_own_entries`).

    Returns the prefixes removed. Sets of live owners (this process included), and anything not in a record, are left
    alone."""
    sdir = sdir or state_dir()
    if not sdir.is_dir():
        return []
    removed: list[str] = []
    with _locked(sdir):
        for path, own in stale_records(sdir):
            _teardown(own)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            removed.append(path.stem)
    return removed


def worker_processes() -> list[tuple[int, int]]:
    """(pid, parent pid it was started for) of every `hil.cluster.worker_main` process on this host, from
    /proc/*/cmdline (a worker in an already deleted namespace is invisible to `ip netns pids`)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"hil.cluster.worker_main" in argv and b"--parent-pid" in argv:
            k = argv.index(b"--parent-pid")
            with contextlib.suppress(IndexError, ValueError):
                if proc_start_time(int(d.name)) is not None:
                    out.append((int(d.name), int(argv[k + 1])))
    return out


def leftovers(owner_pid: int | None = None) -> dict[str, list]:
    """What is left on this host of the cluster sets of `owner_pid` (None: of any owner): namespaces, root links,
    cpu cgroups, worker processes (in such namespaces, or started for that owner) and state files.
    All lists empty = clean (what the cleanup tests assert)."""
    def mine(name: str) -> bool:
        m = _OWNED.match(name)
        return bool(m) and (owner_pid is None or int(m.group(1)) == owner_pid)

    ns = [n for n in _netns_list() if mine(n)]
    ctl = cgroup.detect_cpu_controller()
    cgs = [p.name for p in cgroup.list_groups(ctl, _OWNED) if mine(p.name)] if ctl else []
    procs = {p for n in ns for p in _netns_pids(n)}
    procs |= {pid for pid, parent in worker_processes() if owner_pid is None or parent == owner_pid}
    sdir = state_dir()
    states = [p.name for p in sdir.glob(f"{NAME_PREFIX}*.json") if mine(p.stem)] if sdir.exists() else []
    return {"namespaces": ns, "links": [ln for ln in _root_links() if mine(ln)], "cgroups": cgs,
            "processes": sorted(procs), "state_files": states}


# -- the network -------------------------------------------------------------------------------------------------------
@dataclass
class LinkState:
    rate_bps: float | None = None   # bit/s; None = unshaped
    up: bool = True


class ClusterNet:
    """Hub + `n_devices` device namespaces for one run; a context manager (or `open()` / `close()`, idempotent).

    Device i lives in namespace `ns(i)` at `device_ip(i)`; the controller (this process, root namespace) is at
    `controller_ip`. Run a program inside device i with `exec_prefix(i) + argv`."""

    def __init__(self, n_devices: int, *, sdir: Path | None = None):
        if not (isinstance(n_devices, int) and 1 <= n_devices <= 200):
            raise ValueError(f"n_devices: must be an int in [1, 200], got {n_devices!r}")
        self.n = n_devices
        self.sdir = sdir or state_dir()
        self.prefix = ""
        self.subnet_x = -1
        self.links = [LinkState() for _ in range(n_devices)]
        self._state: dict = {}
        self._opened = False
        self._closed = False
        self._close_lock = threading.RLock()

    # -- names ---------------------------------------------------------------------------------------------------
    @property
    def hub_ns(self) -> str:
        return f"{self.prefix}-hub"

    def ns(self, i: int) -> str:
        return f"{self.prefix}-d{i}"

    @property
    def root_link(self) -> str:
        return f"{self.prefix}r"

    def hub_link(self, i: int) -> str:
        return f"{self.prefix}h{i}"

    def dev_link(self, i: int) -> str:
        return f"{self.prefix}d{i}"

    def device_ip(self, i: int) -> str:
        return f"10.{self.subnet_x}.0.{i + 1}"

    @property
    def controller_ip(self) -> str:
        return f"10.{self.subnet_x}.0.{CONTROLLER_HOST}"

    def exec_prefix(self, i: int) -> list[str]:
        return ["ip", "netns", "exec", self.ns(i)]

    @property
    def state_file(self) -> Path:
        return self.sdir / f"{self.prefix}.json"

    # -- lifetime ------------------------------------------------------------------------------------------------
    def open(self) -> ClusterNet:
        reason = have_tools()
        if reason:
            raise RuntimeError(f"ClusterNet: {reason}")
        if self._opened:
            raise RuntimeError("ClusterNet: already opened (one open() per object)")
        self._opened = True
        cleanup_stale(self.sdir)
        try:
            self._allocate()
            self._build()
        except BaseException:
            self.close()
            self.sweep()
            raise
        return self

    def _allocate(self) -> None:
        """Pick an unused prefix and subnet and write the state file before anything exists (under the lock)."""
        pid = os.getpid()
        with _locked(self.sdir):
            taken_x = {st.get("subnet_x") for _, st in _read_states(self.sdir)}
            nets, links = set(_netns_list()), set(_root_links())
            for k in itertools.count():          # the first free letters: names stay short in long-lived processes
                prefix = f"{NAME_PREFIX}{pid}{_letters(k)}"
                if not (self.sdir / f"{prefix}.json").exists() and f"{prefix}-hub" not in nets \
                        and f"{prefix}r" not in links:
                    break
            self.prefix = prefix
            longest = max(len(self.root_link), len(self.hub_link(self.n - 1)), len(f"{prefix}c"))
            if longest > IFNAMSIZ:
                raise ValueError(f"n_devices: interface names of prefix {prefix!r} would exceed {IFNAMSIZ} chars")
            self.subnet_x = _free_subnet(taken_x, start=pid)
            self._state = {"pid": pid, "start_time": proc_start_time(pid), "prefix": prefix,
                           "subnet_x": self.subnet_x,
                           "namespaces": [self.hub_ns] + [self.ns(i) for i in range(self.n)],
                           "root_links": [self.root_link], "cgroups": [], "pids": [], "paths": []}
            self._write_state()

    def _build(self) -> None:
        hub = self.hub_ns
        self._check_open()
        _run("ip", "netns", "add", hub)
        _run("ip", "-n", hub, "link", "set", "lo", "up")
        _run("ip", "-n", hub, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", hub, "link", "set", "br0", "up")
        hub_c = f"{self.prefix}c"
        _run("ip", "link", "add", self.root_link, "type", "veth", "peer", "name", hub_c, "netns", hub)
        _run("ip", "-n", hub, "link", "set", hub_c, "master", "br0", "up")
        _run("ip", "addr", "add", f"{self.controller_ip}/24", "dev", self.root_link)
        _run("ip", "link", "set", self.root_link, "up")
        for i in range(self.n):
            self._check_open()
            ns, h, d = self.ns(i), self.hub_link(i), self.dev_link(i)
            _run("ip", "netns", "add", ns)
            _run("ip", "link", "add", h, "netns", hub, "type", "veth", "peer", "name", d, "netns", ns)
            _run("ip", "-n", hub, "link", "set", h, "master", "br0", "up")
            _run("ip", "-n", ns, "addr", "add", f"{self.device_ip(i)}/24", "dev", d)
            _run("ip", "-n", ns, "link", "set", d, "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("ClusterNet: closed while being built (signal?)")

    def close(self) -> None:
        """Remove everything this run created (processes in its namespaces are SIGKILLed), then its state file.
        Idempotent; safe to call from a signal handler or atexit, and after a partial open()."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            if not self._state:
                return
            _teardown(self._state)
            with contextlib.suppress(FileNotFoundError):
                self.state_file.unlink()

    def sweep(self) -> None:
        """Remove everything the state record lists once more, even after close(): for a caller whose creation step
        was interrupted by a signal and finished after the clean-up ran."""
        if self._state:
            _teardown(self._state)
            with contextlib.suppress(FileNotFoundError):
                self.state_file.unlink()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> ClusterNet:
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()

    # -- bookkeeping for the layers above --------------------------------------------------------------------------
    def register(self, *, cgroups: list[str] = (), pids: list[int] = (), paths: list[str] = ()) -> None:
        """Record more resources of this run (cpu cgroup names, worker pids, scratch directories) in the state file,
        so `cleanup_stale()` removes them if this process dies. Call BEFORE creating a cgroup / path."""
        with _locked(self.sdir):
            if self._closed:
                raise RuntimeError("ClusterNet: closed")
            self._state["cgroups"] += [c for c in cgroups if c not in self._state["cgroups"]]
            self._state["pids"] += [[int(p), proc_start_time(int(p))] for p in pids]
            self._state["paths"] += [str(p) for p in paths if str(p) not in self._state["paths"]]
            self._write_state()

    def _write_state(self) -> None:
        atomic_write_json(self.state_file, self._state)

    # -- links ---------------------------------------------------------------------------------------------------
    def set_link(self, i: int, rate_bps: float | None, up: bool = True) -> None:
        """Shape device i's link to `rate_bps` bit/s in both directions (None = unshaped) and set it up or down."""
        if not (isinstance(i, int) and 0 <= i < self.n):
            raise ValueError(f"device: index {i!r} out of range [0, {self.n})")
        params = None if rate_bps is None else tbf_params(rate_bps)
        ends = ((self.ns(i), self.dev_link(i)), (self.hub_ns, self.hub_link(i)))
        for ns, dev in ends:
            if params is None:
                r = _run("tc", "-n", ns, "qdisc", "del", "dev", dev, "root", check=False)
                if r.returncode != 0 and "handle of zero" not in r.stderr and "No such file" not in r.stderr \
                        and "Cannot find specified qdisc" not in r.stderr:
                    raise RuntimeError(f"tc qdisc del on {dev} failed: {r.stderr.strip()}")
            else:
                _run("tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", *params.tc_args())
        for ns, dev in ends:
            _run("ip", "-n", ns, "link", "set", dev, "up" if up else "down")
        self.links[i] = LinkState(rate_bps, up)

    def qdisc(self, i: int) -> tuple[dict | None, dict | None]:
        """The root qdisc on (device side, hub side) of device i as `tc -j` reports it (None = default, unshaped)."""
        out = []
        for ns, dev in ((self.ns(i), self.dev_link(i)), (self.hub_ns, self.hub_link(i))):
            r = _run("tc", "-n", ns, "-j", "qdisc", "show", "dev", dev)
            q = [x for x in json.loads(r.stdout or "[]") if x.get("root")]
            out.append(q[0] if q and q[0].get("kind") == "tbf" else None)
        return out[0], out[1]

    def link_up(self, i: int) -> tuple[bool, bool]:
        """Administrative state (device side, hub side) as the kernel reports it."""
        res = []
        for ns, dev in ((self.ns(i), self.dev_link(i)), (self.hub_ns, self.hub_link(i))):
            r = _run("ip", "-n", ns, "-j", "link", "show", "dev", dev)
            res.append("UP" in json.loads(r.stdout)[0].get("flags", []))
        return res[0], res[1]


def _letters(n: int) -> str:
    s = ""
    n += 1
    while n:
        n, r = divmod(n - 1, 26)
        s = chr(ord("a") + r) + s
    return s


def _free_subnet(taken: set, start: int) -> int:
    """An X in SUBNET_RANGE with 10.X.0.0/24 overlapping no route of the root namespace and no other live run."""
    r = _run("ip", "-4", "-j", "route", "show", "table", "all", check=False)
    used = []
    with contextlib.suppress(ValueError):
        for route in json.loads(r.stdout or "[]"):
            dst = route.get("dst", "")
            if dst and dst != "default":
                with contextlib.suppress(ValueError):
                    used.append(ipaddress.ip_network(dst if "/" in dst else f"{dst}/32", strict=False))
    n = len(SUBNET_RANGE)
    for k in range(n):
        x = SUBNET_RANGE[(start + k) % n]
        net = ipaddress.ip_network(f"10.{x}.0.0/24")
        if x not in taken and not any(net.overlaps(u) for u in used):
            return x
    raise RuntimeError("no free 10.X.0.0/24 subnet for the emulated cluster")
