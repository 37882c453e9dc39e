"""Cgroup CPU quotas, the EmulatedCluster life cycle, and the clean-up guarantee: a controller killed at a random
point (SIGKILL / SIGTERM / SIGINT) leaves no namespace, link, qdisc, cgroup, worker process or state file once its own
handlers and `cleanup_stale()` have run (hil/cluster/{cgroup,cluster,guard,netns}.py). Needs root, `ip` and `tc`."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from hil.cluster import cgroup, netns
from hil.cluster.cgroup import CpuController, CpuQuota, cpu_max_line, detect_cpu_controller, quota_us
from hil.cluster.cluster import DeviceEmu, EmulatedCluster
from hil.cluster.netns import cleanup_stale, have_tools, leftovers
from hil.cluster.transport import LinkDown, RemoteError, WorkerDead
from tests.conftest import REPO

REASON = have_tools()
needs_root = pytest.mark.skipif(REASON is not None, reason=f"emulated cluster: {REASON}")
needs_cpu_cgroup = pytest.mark.skipif(detect_cpu_controller() is None, reason="no cgroup with the cpu controller")
F = "tests.hil_cluster.factories:make_echo"


# -- cgroup: pure parts ------------------------------------------------------------------------------------------------
def test_quota_mapping():
    assert quota_us(1.0) == 100_000 and quota_us(0.5) == 50_000 and quota_us(2.5) == 250_000
    assert quota_us(0.001) == cgroup.MIN_QUOTA_US and quota_us(None) == -1
    assert cpu_max_line(0.25) == "25000 100000" and cpu_max_line(None) == "max 100000"
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="cpu_cores"):
            quota_us(bad)


def test_detect_v1_and_v2(tmp_path):
    v1 = "cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0\ncgroup2 /x cgroup2 rw 0 0\n"
    assert detect_cpu_controller(v1) == CpuController(1, Path("/sys/fs/cgroup/cpu"))
    v1b = "cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,cpu,cpuacct 0 0\n"
    assert detect_cpu_controller(v1b).version == 1
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    assert detect_cpu_controller(f"cgroup2 {tmp_path} cgroup2 rw 0 0\n") == CpuController(2, tmp_path)
    (tmp_path / "cgroup.controllers").write_text("cpuset io memory\n")
    assert detect_cpu_controller(f"cgroup2 {tmp_path} cgroup2 rw 0 0\n") is None
    assert detect_cpu_controller("cgroup /sys/fs/cgroup/cpuset cgroup rw,cpuset 0 0\n") is None


def test_v2_files_written(tmp_path):
    """The v2 path against a stand-in directory (this host mounts the cpu controller on v1)."""
    (tmp_path / "cgroup.subtree_control").write_text("")
    (tmp_path / "grp").mkdir()
    for f in ("cpu.max", "cgroup.procs"):
        (tmp_path / "grp" / f).write_text("")
    q = CpuQuota.__new__(CpuQuota)
    q.controller, q.name, q.period_us = CpuController(2, tmp_path), "grp", 100_000
    q.path, q._closed = tmp_path / "grp", False
    cgroup._enable_v2_cpu(tmp_path)
    q.set_cores(1.5)
    assert (tmp_path / "cgroup.subtree_control").read_text() == "+cpu"
    assert (tmp_path / "grp" / "cpu.max").read_text() == "150000 100000"


def test_bad_names():
    with pytest.raises(ValueError, match="cgroup name"):
        CpuQuota("../x", 1.0, controller=CpuController(1, Path("/nonexistent")))


# -- signal guard (no root needed) ---------------------------------------------------------------------------------
def test_guard_closes_then_chains_to_the_previous_handler():
    from hil.cluster import guard

    log = []

    class Res:
        def close(self):
            log.append("closed")

    def previous(signum, frame):
        log.append(f"previous {signum}")

    old = signal.signal(signal.SIGTERM, previous)
    try:
        r = Res()
        guard.register(r)
        assert signal.getsignal(signal.SIGTERM) is guard._handler
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)                                         # let the main thread run the handler
        assert log == ["closed", f"previous {int(signal.SIGTERM)}"]
        assert signal.getsignal(signal.SIGTERM) is previous      # restored once nothing is registered
        guard.register(r)
        guard.unregister(r)
        assert signal.getsignal(signal.SIGTERM) is previous and log == ["closed", f"previous {int(signal.SIGTERM)}"]
    finally:
        signal.signal(signal.SIGTERM, old)


# -- cgroup: real --------------------------------------------------------------------------------------------------
@needs_root
@needs_cpu_cgroup
def test_cpu_quota_limits_a_process_and_is_removed():
    ctl = detect_cpu_controller()
    name = f"{netns.NAME_PREFIX}{os.getpid()}zz-q"
    spin = subprocess.Popen([sys.executable, "-c", "import time\nt=time.time()\nwhile time.time()-t<30: pass"])
    try:
        with CpuQuota(name, 0.2) as q:
            if ctl.version == 1:
                assert (q.path / "cpu.cfs_quota_us").read_text().strip() == "20000"
                assert (q.path / "cpu.cfs_period_us").read_text().strip() == "100000"
            else:
                assert (q.path / "cpu.max").read_text().split() == ["20000", "100000"]
            q.add(spin.pid)
            assert q.pids() == [spin.pid]
            c0 = _cpu_s(spin.pid)
            time.sleep(1.0)
            used = _cpu_s(spin.pid) - c0
            assert used < 0.6, f"a 0.2-core quota let the spinner use {used:.2f} CPU s in 1 s"
            assert q.stat().get("nr_throttled", q.stat().get("nr_throttled", 1)) > 0
            q.set_cores(None)                         # unlimited again
        assert not q.path.exists() and spin.poll() is None       # process moved back to the root, not killed
    finally:
        spin.kill()
        spin.wait()


def _cpu_s(pid: int) -> float:
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


# -- the cluster ---------------------------------------------------------------------------------------------------
@needs_root
@needs_cpu_cgroup
def test_cluster_start_use_reshape_close():
    devs = [DeviceEmu("phone", 1.0, F, {"tag": "p"}), DeviceEmu("tablet", 0.5, F, {"tag": "t"}),
            DeviceEmu("watch", None, F, {"tag": "w"}, rate_bps=20e6, latency_s=0.002)]
    with EmulatedCluster() as c:
        clients = c.start(devs)
        infos = [cl.call("info") for cl in clients]
        assert [x["tag"] for x in infos] == ["p", "t", "w"]
        assert len({x["netns"] for x in infos}) == 3 and infos[0]["netns"] != os.readlink("/proc/self/ns/net")
        ctl = detect_cpu_controller()
        if ctl.version == 1:
            cpu_lines = [[ln for ln in x["cgroup"] if ln.split(":")[1] == "cpu"][0] for x in infos]
            assert cpu_lines[0].endswith(f"/{c.net.prefix}-d0") and cpu_lines[1].endswith(f"/{c.net.prefix}-d1")
            assert cpu_lines[2].endswith(":/")                                   # no quota: root group
        assert c.net.qdisc(2)[0]["kind"] == "tbf" and clients[2].latency_s == 0.002
        x = np.arange(128 * 1152, dtype=np.float32).reshape(128, 1152)
        np.testing.assert_array_equal(clients[1].call("echo", x)[0], x)
        with pytest.raises(RemoteError, match="ValueError: nope"):
            clients[0].call("fail", message="nope")
        c.set_link(1, rate_bps=None, up=False)
        with pytest.raises(LinkDown):
            clients[1].call("ping")
        c.set_link(1, rate_bps=50e6, up=True)
        assert clients[1].call("value")["tag"] == "t"
        c.set_cpu(0, 0.25)
        assert set(c.drain_trace()) == {"phone", "tablet", "watch"}
        prefix, pids = c.net.prefix, [p.pid for p in c.procs]
    assert c.closed and all(p.poll() is not None for p in c.procs)
    left = leftovers(os.getpid())
    assert not any(str(x).startswith(prefix) for v in left.values() for x in v), left
    assert not any(Path(f"/proc/{p}").exists() and netns.pid_alive(p) for p in pids)
    assert not Path(f"/tmp/{prefix}-logs").exists()
    c.close()                                                                    # idempotent


@needs_root
def test_worker_crash_is_a_clear_error_and_close_still_cleans():
    with EmulatedCluster(call_timeout_s=60) as c:
        clients = c.start([DeviceEmu("a", None, F), DeviceEmu("b", None, F)])
        os.kill(c.procs[1].pid, signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(WorkerDead):
            clients[1].call("sleep", seconds=0.0)
        assert time.monotonic() - t0 < 10
        prefix = c.net.prefix
    assert not [n for n in netns._netns_list() if n.startswith(prefix)]


@needs_root
def test_bad_factory_fails_start_with_the_worker_log_and_cleans_up():
    c = EmulatedCluster(start_timeout_s=30)
    with pytest.raises(RuntimeError, match="factory refuses on purpose"):
        c.start([DeviceEmu("a", None, "tests.hil_cluster.factories:make_broken")])
    assert c.closed and not leftovers(os.getpid())["namespaces"]


def test_device_emu_validation():
    with pytest.raises(ValueError, match="cpu_cores"):
        DeviceEmu("x", 0.0, F)
    with pytest.raises(ValueError, match="factory"):
        DeviceEmu("x", 1.0, "nocolon")
    with pytest.raises(ValueError, match="factory_args"):
        DeviceEmu("x", 1.0, F, {"a": object()})
    with pytest.raises(ValueError, match="latency_s"):
        DeviceEmu("x", 1.0, F, latency_s=-1)


# -- killed controllers ------------------------------------------------------------------------------------------------
CHILD = f"""
import signal, sys, time
# a controller started from an interactive shell: SIGINT raises KeyboardInterrupt (a background job of a
# non-interactive shell, e.g. `nohup make test &`, inherits SIGINT ignored, and the SIGINT runs would never end)
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.path.insert(0, {str(REPO)!r})
from hil.cluster.cluster import DeviceEmu, EmulatedCluster
F = {F!r}
c = EmulatedCluster()
c.start([DeviceEmu("d0", 1.0, F), DeviceEmu("d1", 0.5, F, rate_bps=20e6), DeviceEmu("d2", 0.25, F, latency_s=0.001)])
print("started", flush=True)
time.sleep(60)
"""
SIGNALS = (signal.SIGKILL, signal.SIGTERM, signal.SIGINT)


def _kill_runs(runs: int, seed: int, max_delay_s: float) -> list[dict]:
    rng = random.Random(seed)
    results = []
    for k in range(runs):
        sig = SIGNALS[k % 3]
        delay = rng.uniform(0.0, max_delay_s)
        child = subprocess.Popen([sys.executable, "-c", CHILD], cwd=REPO, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
        time.sleep(delay)
        child.send_signal(sig)
        try:
            child.wait(timeout=20)
        except subprocess.TimeoutExpired:      # a handler that hangs is a failure, but do not leave it running
            child.kill()
            child.wait()
            results.append({"run": k, "sig": sig.name, "delay": delay, "hung": True})
            continue
        # SIGTERM / SIGINT: the child's own handlers must already have removed everything (worker processes may
        # take a moment to exit after their parent-death signal)
        own = _wait_clean(child.pid, 5.0) if sig != signal.SIGKILL else None
        before = {k: len(v) for k, v in leftovers(child.pid).items() if v}
        cleanup_stale()
        after = _wait_clean(child.pid, 5.0)
        results.append({"run": k, "sig": sig.name, "delay": round(delay, 3), "rc": child.returncode,
                         "left_by_handlers": own, "found_by_cleanup": before, "left_after_cleanup": after})
    exercised = sum(bool(r.get("found_by_cleanup")) for r in results)
    print(f"\n{len(results)} killed controllers; {exercised} left a set for cleanup_stale(); "
          f"leftovers after clean-up: {sum(bool(r.get('left_after_cleanup')) for r in results)}")
    return results


def _wait_clean(pid: int, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        left = {k: v for k, v in leftovers(pid).items() if v}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def _check(results: list[dict]) -> None:
    bad = [r for r in results if r.get("hung") or r["left_after_cleanup"] or r["left_by_handlers"]]
    assert not bad, f"{len(bad)} of {len(results)} runs left something: {bad}"


@needs_root
@needs_cpu_cgroup
def test_killed_controllers_leave_nothing():
    """21 seeded runs: a 3-device cluster controller killed by SIGKILL / SIGTERM / SIGINT at a random point of its
    start-up (0–1.5 s after spawn, covering import, network set-up, cgroups, worker spawn and idle)."""
    _check(_kill_runs(21, seed=12, max_delay_s=1.5))


@pytest.mark.slow
@needs_root
@needs_cpu_cgroup
def test_killed_controllers_leave_nothing_long():
    _check(_kill_runs(120, seed=1212, max_delay_s=2.5))


@pytest.mark.bench
@needs_root
@needs_cpu_cgroup
def test_bench_cluster_start_close_and_rpc():
    """Measured: start / close wall time of a 3-device cluster, and the RPC round trip controller -> worker through
    the namespaces and bridge, unshaped, no added latency (0 B and a 128×1152 fp32 = 576 KiB tensor each way)."""
    import json

    starts, closes, rtt = [], [], {}
    for rep in range(5):
        c = EmulatedCluster()
        clients = c.start([DeviceEmu(f"d{i}", 1.0, F) for i in range(3)])
        if rep == 0:
            for label, arrays in (("0B", ()), ("576KiB", (np.ones((128, 1152), np.float32),))):
                for _ in range(20):
                    clients[1].call("echo", *arrays)
                ts = []
                for _ in range(200):
                    t0 = time.perf_counter()
                    clients[1].call("echo", *arrays)
                    ts.append(time.perf_counter() - t0)
                rtt[label] = {"median_ms": round(1e3 * float(np.median(ts)), 3),
                              "p90_ms": round(1e3 * float(np.percentile(ts, 90)), 3)}
            # shaped 50 Mbit/s + 5 ms one-way: 576 KiB each way; modelled = 2 × (bytes / TCP goodput + latency)
            c.set_link(1, rate_bps=50e6, latency_s=0.005)
            x = np.ones((128, 1152), np.float32)
            ts = []
            for _ in range(10):
                t0 = time.perf_counter()
                clients[1].call("echo", x)
                ts.append(time.perf_counter() - t0)
            modelled = 2 * (x.nbytes * 8 / (50e6 * 1448 / 1514) + 0.005)
            rtt["576KiB_50mbit_5ms"] = {"median_ms": round(1e3 * float(np.median(ts)), 1),
                                        "modelled_ms": round(1e3 * modelled, 1)}
        c.close()
        starts.append(c.timings["start_s"])
        closes.append(c.timings["close_s"])
    print("\nmeasured: start_s", [round(x, 3) for x in starts], "close_s", [round(x, 3) for x in closes],
          "\nmeasured RPC round trip via netns (worker in a 1.0-core cgroup):", json.dumps(rtt))
