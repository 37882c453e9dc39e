"""Network namespaces + tc tbf shaping of the emulated cluster (hil/cluster/netns.py). Needs root, `ip` and `tc`."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hil.cluster import netns
from hil.cluster.netns import IFNAMSIZ, MTU_FRAME, ClusterNet, have_tools, leftovers, tbf_params

REASON = have_tools()
needs_root = pytest.mark.skipif(REASON is not None, reason=f"emulated cluster network: {REASON}")

# TCP goodput over a shaped link: tbf counts whole Ethernet frames (1514 B) while TCP carries 1448 B of payload in
# each (MSS 1460 - 12 B timestamp option), so goodput = 0.956 × rate. Band around the SET rate: generous for a loaded
# 2-core host, tight enough to catch a wrong unit (bytes vs bits = 8×) or a missing / one-sided shaper.
BAND = (0.75, 1.05)


# -- tbf parameters (no root needed) ----------------------------------------------------------------------------------
@pytest.mark.parametrize("rate", [1e6, 20e6, 50e6, 1e9])
@pytest.mark.parametrize("hz", [100, 250, 1000])
def test_tbf_params_rules(rate, hz):
    p = tbf_params(rate, hz=hz)
    assert p.rate_bps == int(rate)
    assert p.burst >= rate / 8 / hz and p.burst >= 2 * MTU_FRAME
    assert p.limit >= p.burst + 16 * MTU_FRAME and p.limit >= p.burst + rate / 8 * netns.QUEUE_S
    assert p.tc_args()[:2] == ["tbf", "rate"]


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), 1e12, "20mbit"])
def test_tbf_params_rejects(bad):
    with pytest.raises(ValueError, match="rate_bps"):
        tbf_params(bad)


def test_kernel_hz_is_a_plausible_value():
    assert netns.kernel_hz() in (100, 250, 300, 1000)


# -- the network ----------------------------------------------------------------------------------------------------
RECV = r"""
import json, socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1); print("ready", flush=True)
c, _ = s.accept(); n = 0; t0 = None; first = 0; t1 = None
while True:
    b = c.recv(1 << 20)
    if not b:
        break
    if t0 is None:
        t0 = time.monotonic(); first = len(b)
    n += len(b); t1 = time.monotonic()
print(json.dumps({"bytes": n, "first": first, "s": (t1 - t0) if t0 else 0.0}), flush=True)
"""
SEND = r"""
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30)
s.sendall(b"x" * int(sys.argv[3])); s.close()
"""


def measure_goodput(net: ClusterNet, i: int, nbytes: int, direction: str, port: int = 5601) -> float:
    """Measured TCP goodput (bit/s) between the controller (root ns) and device i: 'down' = controller -> device,
    'up' = device -> controller. Timed at the receiver from the first to the last byte (the first read excluded)."""
    py = sys.executable
    if direction == "down":
        rx = subprocess.Popen(net.exec_prefix(i) + [py, "-c", RECV, net.device_ip(i), str(port)],
                              stdout=subprocess.PIPE, text=True)
        tx = [py, "-c", SEND, net.device_ip(i), str(port), str(nbytes)]
    else:
        rx = subprocess.Popen([py, "-c", RECV, net.controller_ip, str(port)], stdout=subprocess.PIPE, text=True)
        tx = net.exec_prefix(i) + [py, "-c", SEND, net.controller_ip, str(port), str(nbytes)]
    try:
        assert rx.stdout.readline().strip() == "ready"
        subprocess.run(tx, check=True, timeout=120)
        out = json.loads(rx.stdout.readline())
    finally:
        rx.kill()
        rx.wait()
    assert out["bytes"] == nbytes
    return (out["bytes"] - out["first"]) * 8 / out["s"]


def _connect_ok(ns_prefix: list[str], ip: str, port: int, timeout: float = 1.0) -> bool:
    """Can a TCP connection be opened from `ns_prefix` (a namespace's exec prefix, or [] = root) to ip:port?"""
    code = (f"import socket,sys\ntry:\n socket.create_connection(('{ip}', {port}), timeout={timeout}).close()\n"
            f"except OSError: sys.exit(1)")
    return subprocess.run(ns_prefix + [sys.executable, "-c", code], timeout=30).returncode == 0


class _Listener:
    """A TCP listener inside device i's namespace (accepts and closes)."""

    def __init__(self, net: ClusterNet, i: int, port: int):
        code = (f"import socket\ns = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
                f"s.bind(('{net.device_ip(i)}', {port})); s.listen(8); print('ready', flush=True)\n"
                f"while True:\n c, _ = s.accept(); c.close()")
        self.p = subprocess.Popen(net.exec_prefix(i) + [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        assert self.p.stdout.readline().strip() == "ready"

    def close(self):
        self.p.kill()
        self.p.wait()


@pytest.fixture(scope="module")
def net():
    if REASON:
        pytest.skip(f"emulated cluster network: {REASON}")
    with ClusterNet(3) as n:
        yield n


@needs_root
def test_topology_names_and_state(net):
    assert {net.hub_ns, *(net.ns(i) for i in range(3))} <= set(netns._netns_list())
    assert net.root_link in netns._root_links()
    for name in (net.root_link, net.hub_link(2), net.dev_link(2), f"{net.prefix}c"):
        assert len(name) <= IFNAMSIZ
    st = json.loads(net.state_file.read_text())
    assert st["pid"] == netns.os.getpid() and st["prefix"] == net.prefix
    assert st["namespaces"] == [net.hub_ns, net.ns(0), net.ns(1), net.ns(2)]
    assert net.device_ip(0).startswith(f"10.{net.subnet_x}.0.") and net.controller_ip.endswith(".254")


@needs_root
def test_controller_and_devices_reach_each_other(net):
    ls = [_Listener(net, i, 5602) for i in range(3)]
    try:
        assert all(_connect_ok([], net.device_ip(i), 5602) for i in range(3))           # controller -> device
        assert _connect_ok(net.exec_prefix(0), net.device_ip(2), 5602)                  # device -> device
    finally:
        for x in ls:
            x.close()


@needs_root
def test_set_link_shapes_both_ends_and_goes_down(net):
    net.set_link(1, 20e6)
    dev, hub = net.qdisc(1)
    want = tbf_params(20e6)
    for q in (dev, hub):
        assert q["kind"] == "tbf" and q["options"]["rate"] == 20e6 / 8 and q["options"]["burst"] == want.burst
    assert net.qdisc(0) == (None, None)                                  # other devices untouched
    ls = _Listener(net, 1, 5603)
    try:
        net.set_link(1, 20e6, up=False)
        assert net.link_up(1) == (False, False)
        assert not _connect_ok([], net.device_ip(1), 5603, timeout=0.5)
        net.set_link(1, 20e6, up=True)
        assert net.link_up(1) == (True, True) and net.qdisc(1)[0]["kind"] == "tbf"
        assert _connect_ok([], net.device_ip(1), 5603, timeout=5.0)
    finally:
        ls.close()
    net.set_link(1, None)
    assert net.qdisc(1) == (None, None)
    net.set_link(1, None)                                                # removing twice is fine
    with pytest.raises(ValueError, match="device"):
        net.set_link(3, 1e6)


@needs_root
@pytest.mark.parametrize("rate", [20e6, 50e6])
@pytest.mark.parametrize("direction", ["down", "up"])
def test_shaped_throughput_matches_the_set_rate(net, rate, direction):
    net.set_link(2, rate)
    try:
        got = measure_goodput(net, 2, nbytes=3_000_000, direction=direction)
    finally:
        net.set_link(2, None)
    assert BAND[0] * rate <= got <= BAND[1] * rate, f"set {rate / 1e6} Mbit/s, measured {got / 1e6:.2f} Mbit/s"


@needs_root
def test_unshaped_is_much_faster_than_shaped(net):
    got = measure_goodput(net, 0, nbytes=3_000_000, direction="down")
    assert got > 1.5 * 50e6


@needs_root
def test_close_removes_everything_and_is_idempotent():
    n = ClusterNet(2)
    n.open()
    n.set_link(0, 5e6)
    prefix = n.prefix
    assert any(x.startswith(prefix) for x in netns._netns_list())
    n.close()
    n.close()
    left = leftovers(netns.os.getpid())
    assert not any(v for k, v in left.items() if any(str(x).startswith(prefix) for x in v)), left
    assert not n.state_file.exists()


@needs_root
def test_subnets_of_two_live_runs_differ():
    with ClusterNet(1) as a, ClusterNet(1) as b:
        assert a.prefix != b.prefix and a.subnet_x != b.subnet_x


def test_bad_device_count():
    with pytest.raises(ValueError, match="n_devices"):
        ClusterNet(0)


@pytest.mark.bench
@needs_root
def test_bench_shaping_accuracy():
    """Measured goodput vs set rate at 1, 20, 50, 200 Mbit/s and 1 Gbit/s, both directions."""
    rows = []
    with ClusterNet(1) as n:
        for rate in (1e6, 20e6, 50e6, 200e6, 1e9):
            n.set_link(0, rate)
            nbytes = int(max(2e6, rate / 8 * 0.8))
            for d in ("down", "up"):
                got = measure_goodput(n, 0, nbytes, d)
                rows.append({"set_mbit": rate / 1e6, "dir": d, "bytes": nbytes, "measured_mbit": round(got / 1e6, 2),
                             "ratio": round(got / rate, 3)})
    print("\nmeasured TCP goodput over tbf:\n" + "\n".join(json.dumps(r) for r in rows))
    assert all(BAND[0] <= r["ratio"] <= BAND[1] for r in rows)
