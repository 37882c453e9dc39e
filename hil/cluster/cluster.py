"""An emulated multi-device cluster on this host: one worker process per device, each in its own network namespace
(netns.ClusterNet, tc tbf link shaping) and cpu cgroup (cgroup.CpuQuota), reached over pyzmq RPC
(transport.RpcClient, user-space latency). Voltron §5.1 (a cluster of heterogeneous devices over Wi-Fi Direct) and
§3.2.3 / §4.4 (bandwidth, latency and connectivity change at run time). Generic: it knows nothing of models; the
served object comes from a `module:callable` factory. See docs/cluster.md ("Emulated cluster: plumbing").

    cluster = EmulatedCluster()
    clients = cluster.start([DeviceEmu("phone", 1.0, "pkg.mod:make", {"shard": 0}), ...])
    y = clients[1].call("forward", x, layer=3)
    cluster.set_link(1, rate_bps=20e6, latency_s=0.004)      # or up=False: calls fail fast with LinkDown
    cluster.close()                                          # or `with EmulatedCluster() as cluster:`

The controller (this process) stays in the root namespace and reaches the hub bridge through its own unshaped veth
(10.X.0.254); device i's worker listens on tcp://10.X.0.<i+1>:<port>. Workers are spawned as
`sh -c 'echo $$ > <cgroup>/cgroup.procs; exec ip netns exec <ns> python -m hil.cluster.worker_main …'` (one pid
throughout, in its cgroup before Python starts), in their own session (a terminal's Ctrl-C reaches only the
controller, which then shuts them down). Call `start` from the main thread (or a thread that outlives the cluster):
a worker's parent-death signal fires when the thread that spawned it exits.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from hil.cluster import guard
from hil.cluster.cgroup import PERIOD_US, CpuQuota, detect_cpu_controller
from hil.cluster.netns import ClusterNet
from hil.cluster.transport import MessageRecord, RpcClient, RpcError

REPO = Path(__file__).resolve().parents[2]
DEFAULT_PORT = 5555


@dataclass(frozen=True)
class DeviceEmu:
    """One emulated device."""
    name: str                          # label (e.g. "phone"), used in errors and traces
    cpu_cores: float | None            # CPUs' worth of CFS quota (0.5 = half a core); None = unlimited
    factory: str                       # "module:callable" that builds the served object inside the worker
    factory_args: dict = field(default_factory=dict)   # JSON keyword arguments for the factory
    rate_bps: float | None = None      # bit/s, initial link rate (tbf, both directions); None = unshaped
    latency_s: float = 0.0             # s, initial one-way latency added by the controller's client
    cpu_period_us: int = PERIOD_US     # µs, CFS period of the quota (quota = cpu_cores × period)

    def __post_init__(self):
        if not (isinstance(self.name, str) and self.name):
            raise ValueError(f"device.name: must be a non-empty string, got {self.name!r}")
        if self.cpu_cores is not None and not (isinstance(self.cpu_cores, (int, float))
                                               and math.isfinite(self.cpu_cores) and self.cpu_cores > 0):
            raise ValueError(f"device {self.name}: cpu_cores must be > 0 (or None), got {self.cpu_cores!r}")
        if not (isinstance(self.factory, str) and ":" in self.factory):
            raise ValueError(f"device {self.name}: factory must be 'module:callable', got {self.factory!r}")
        try:
            json.dumps(self.factory_args)
        except TypeError as e:
            raise ValueError(f"device {self.name}: factory_args must be JSON values ({e})") from None
        if not isinstance(self.factory_args, dict):
            raise ValueError(f"device {self.name}: factory_args must be a dict, got {type(self.factory_args).__name__}")
        if self.rate_bps is not None and not (isinstance(self.rate_bps, (int, float)) and self.rate_bps > 0):
            raise ValueError(f"device {self.name}: rate_bps must be > 0 (or None), got {self.rate_bps!r}")
        if not (isinstance(self.cpu_period_us, int) and 1_000 <= self.cpu_period_us <= 1_000_000):
            raise ValueError(f"device {self.name}: cpu_period_us must be an int in [1000, 1000000], "
                             f"got {self.cpu_period_us!r}")
        if not (isinstance(self.latency_s, (int, float)) and 0 <= self.latency_s < 60):
            raise ValueError(f"device {self.name}: latency_s must be in [0, 60) s, got {self.latency_s!r}")


class EmulatedCluster:
    """Start / reshape / close a cluster of worker processes. `close()` is idempotent and runs on SIGINT, SIGTERM
    and interpreter exit while the cluster is open (hil.cluster.guard)."""

    def __init__(self, *, port: int = DEFAULT_PORT, start_timeout_s: float = 60.0, call_timeout_s: float = 120.0,
                 stop_timeout_s: float = 2.0, python: str = sys.executable):
        if not (isinstance(port, int) and 1024 <= port <= 65535):
            raise ValueError(f"port: must be an int in [1024, 65535], got {port!r}")
        self.port, self.python = port, python
        self.start_timeout_s, self.call_timeout_s, self.stop_timeout_s = start_timeout_s, call_timeout_s, stop_timeout_s
        self.devices: list[DeviceEmu] = []
        self.net: ClusterNet | None = None
        self.quotas: list[CpuQuota | None] = []
        self.procs: list[subprocess.Popen] = []
        self.clients: list[RpcClient] = []
        self.log_dir: Path | None = None
        self.timings: dict[str, float] = {}     # measured wall s: start_s, close_s
        self._lock = threading.RLock()
        self._started = False
        self._closed = False

    # -- start -------------------------------------------------------------------------------------------------
    def start(self, devices: list[DeviceEmu]) -> list[RpcClient]:
        """Build the network and cgroups, spawn one worker per device, wait until each answers `ping`; returns one
        RpcClient per device (same order). On any failure everything is removed and the error re-raised."""
        if self._started:
            raise RuntimeError("EmulatedCluster: start() called twice (make a new cluster)")
        if not devices or not all(isinstance(d, DeviceEmu) for d in devices):
            raise ValueError("devices: a non-empty list of DeviceEmu")
        names = [d.name for d in devices]
        if len(set(names)) != len(names):
            raise ValueError(f"devices: names must be unique, got {names}")
        if any(d.cpu_cores is not None for d in devices) and detect_cpu_controller() is None:
            raise RuntimeError("devices: cpu_cores set but no cgroup hierarchy with the cpu controller is mounted")
        self._started = True
        self.devices = list(devices)
        t0 = time.monotonic()
        guard.register(self)
        try:
            self._start()
        except BaseException:
            self.close()
            self._sweep()
            raise
        self.timings["start_s"] = time.monotonic() - t0
        return self.clients

    def _start(self) -> None:
        n = len(self.devices)
        self.net = net = ClusterNet(n)
        net.open()
        self.log_dir = Path("/tmp") / f"{net.prefix}-logs"
        cg_names = [f"{net.prefix}-d{i}" for i, d in enumerate(self.devices) if d.cpu_cores is not None]
        net.register(cgroups=cg_names, paths=[str(self.log_dir)])     # recorded before they exist
        self.log_dir.mkdir(mode=0o700)
        for i, d in enumerate(self.devices):
            self._check_open()
            self.quotas.append(CpuQuota(f"{net.prefix}-d{i}", d.cpu_cores, period_us=d.cpu_period_us)
                               if d.cpu_cores is not None else None)
        for i in range(n):
            self._check_open()
            proc = self._spawn(i)
            self.procs.append(proc)
            net.register(pids=[proc.pid])
        for i, (d, proc) in enumerate(zip(self.devices, self.procs)):
            client = RpcClient(self.endpoint(i), timeout_s=self.call_timeout_s, name=f"d{i}:{d.name}",
                               alive=lambda p=proc: p.poll() is None)
            self.clients.append(client)
        deadline = time.monotonic() + self.start_timeout_s
        for i, client in enumerate(self.clients):
            try:
                client.ping(timeout_s=max(0.1, deadline - time.monotonic()))
            except RpcError as e:
                raise RuntimeError(f"device {i} ({self.devices[i].name}): worker not ready: {e}\n"
                                   f"{self._log_tail(i)}") from None
        for i, d in enumerate(self.devices):
            if d.rate_bps is not None or d.latency_s:
                self.set_link(i, rate_bps=d.rate_bps, latency_s=d.latency_s)

    def _spawn(self, i: int) -> subprocess.Popen:
        d, net = self.devices[i], self.net
        worker = [self.python, "-m", "hil.cluster.worker_main", "--bind", self.endpoint(i),
                  "--factory", d.factory, "--factory-args", json.dumps(d.factory_args),
                  "--parent-pid", str(os.getpid())]
        argv = net.exec_prefix(i) + worker
        q = self.quotas[i]
        if q is not None:     # join the cgroup first, then exec: the worker never runs outside its quota
            argv = ["sh", "-c", 'echo $$ > "$1" && shift && exec "$@"', "sh", str(q.procs_file), *argv]
        env = dict(os.environ)
        for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):   # one thread per emulated device:
            env[k] = "1"                                                          # its CPU quota is its speed
        env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        log = open(self.log_dir / f"d{i}.log", "wb")
        try:
            return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                                    cwd=str(REPO), start_new_session=True)
        finally:
            log.close()

    def _log_tail(self, i: int, n: int = 2000) -> str:
        try:
            text = (self.log_dir / f"d{i}.log").read_text(errors="replace")
        except (OSError, TypeError):
            return "(no worker log)"
        return f"--- worker log (last {n} chars) ---\n{text[-n:]}"

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("EmulatedCluster: closed while starting (signal?)")

    # -- run-time changes -------------------------------------------------------------------------------------------
    def endpoint(self, i: int) -> str:
        return f"tcp://{self.net.device_ip(i)}:{self.port}"

    def set_link(self, i: int, *, rate_bps: float | None = None, latency_s: float | None = None,
                 up: bool = True) -> None:
        """Device i's link: tbf rate in both directions (None = unshaped), the one-way latency its client adds
        (None = unchanged) and up / down (down: kernel link down and the client fails fast with LinkDown)."""
        self.net.set_link(i, rate_bps, up)
        if latency_s is not None:
            self.clients[i].set_latency(latency_s)
        self.clients[i].set_link_down(not up)

    def set_cpu(self, i: int, cores: float | None) -> None:
        """Change device i's CPU quota at run time (its cgroup must exist: cpu_cores was set at start)."""
        if self.quotas[i] is None:
            raise ValueError(f"device {i}: started without cpu_cores, so it has no cgroup to re-quota")
        self.quotas[i].set_cores(cores)

    def drain_trace(self) -> dict[str, list[MessageRecord]]:
        """Per-device message records since the last drain (measured, controller's monotonic clock)."""
        return {d.name: c.drain_trace() for d, c in zip(self.devices, self.clients)}

    # -- close -------------------------------------------------------------------------------------------------------
    def close(self) -> None:
        """Shutdown RPCs, then SIGTERM, then SIGKILL after `stop_timeout_s`; then cgroups, qdiscs, links, namespaces,
        logs and the state file. Idempotent; safe from a signal handler and after a failed start."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            t0 = time.monotonic()
            try:
                self._stop_workers()
                for c in self.clients:
                    c.close()
                for q in self.quotas:
                    if q is not None:
                        q.close()
            finally:
                if self.net is not None:
                    self.net.close()          # also SIGKILLs anything left in the namespaces
                guard.unregister(self)
            self.timings["close_s"] = time.monotonic() - t0

    def _stop_workers(self) -> None:
        asked = []
        for c, p in zip(self.clients, self.procs):
            if p.poll() is None and not c.busy and not c.link_down:
                c.set_latency(0.0)
                with contextlib.suppress(RpcError, OSError):
                    c.call("shutdown", timeout_s=min(1.0, self.stop_timeout_s))
                    asked.append(p)
        self._wait(asked)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            alive = [p for p in self.procs if p.poll() is None]
            for p in alive:
                with contextlib.suppress(OSError):
                    p.send_signal(sig)
            self._wait(alive)

    def _wait(self, procs: list[subprocess.Popen]) -> None:
        deadline = time.monotonic() + self.stop_timeout_s
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=max(0.0, deadline - time.monotonic()))

    def _sweep(self) -> None:
        """After a failed start: remove what an interrupted creation step may have made after close() ran."""
        for p in self.procs:
            with contextlib.suppress(OSError):
                p.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=self.stop_timeout_s)
        if self.net is not None:
            self.net.sweep()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> EmulatedCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        prefix = self.net.prefix if self.net else "-"
        return f"EmulatedCluster({prefix}, {len(self.devices)} devices, {'closed' if self._closed else 'open'})"
