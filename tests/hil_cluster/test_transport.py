"""pyzmq RPC of the emulated cluster (hil/cluster/transport.py, worker_main.py) on loopback: no root needed."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from hil.cluster.transport import (
    LinkDown,
    Payload,
    RemoteError,
    RpcClient,
    RpcServer,
    RpcTimeout,
    WorkerDead,
    decode_arrays,
    encode_arrays,
)
from tests.conftest import REPO
from tests.hil_cluster.factories import Echo

FACTORY = "tests.hil_cluster.factories:make_echo"


@pytest.fixture
def served():
    """(client, echo object) with an RpcServer on a loopback port in a thread."""
    obj = Echo("t")
    server = RpcServer(obj, "tcp://127.0.0.1:*")
    th = threading.Thread(target=server.serve_forever, daemon=True)
    th.start()
    client = RpcClient(server.endpoint, timeout_s=10.0)
    yield client, obj
    client.close()
    server.stop()
    th.join(5)
    server.close()


ARRAYS = [
    np.arange(12, dtype=np.float32).reshape(3, 4),
    np.arange(10, dtype=np.int8)[::2],                      # non-contiguous: sent as a contiguous copy
    np.zeros((0, 5), dtype=np.float16),                     # empty
    np.array(3.5),                                          # 0-d
    np.array([True, False, True]),
    np.arange(6, dtype=">i4").reshape(2, 3),                # big-endian dtype survives
    np.array([1 + 2j, 3j]),                                 # complex128
    np.array(["2026-11-30", "1970-01-01"], dtype="M8[s]"),  # datetime64
    np.random.default_rng(0).standard_normal((128, 1152)).astype(np.float32),   # 576 KiB: zero-copy path
]


def test_arrays_round_trip_exactly(served):
    client, _ = served
    out = client.call("echo", *ARRAYS)
    assert isinstance(out, list) and len(out) == len(ARRAYS)
    for a, b in zip(ARRAYS, out):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)


def test_result_kinds(served):
    client, obj = served
    a, b = np.arange(4.0), np.ones(4)
    np.testing.assert_array_equal(client.call("add", a, b), a + b)             # one array -> ndarray
    assert client.call("echo") is None                                          # None
    assert client.call("value", k=[1, "x"]) == {"tag": "t", "kwargs": {"k": [1, "x"]}, "calls": 1}
    got = client.call("scale_inplace", np.arange(3, dtype=np.float64), factor=3.0)   # received views are writable
    np.testing.assert_array_equal(got, [0.0, 3.0, 6.0])
    p = client.call("ping")
    assert p["pid"] == os.getpid() and "echo" in p["methods"] and "_dispatch" not in p["methods"]


def test_payload_round_trip(served):
    client, obj = served
    obj.mixed = lambda x: Payload({"n": int(x.size)}, [x * 2, x[:1]])
    r = client.call("mixed", np.arange(5, dtype=np.int32))
    assert isinstance(r, Payload) and r.value == {"n": 5}
    np.testing.assert_array_equal(r.arrays[0], np.arange(5) * 2)
    np.testing.assert_array_equal(r.arrays[1], [0])


def test_remote_exception_is_clear_and_server_survives(served):
    client, _ = served
    with pytest.raises(RemoteError) as ei:
        client.call("fail", message="bad shard")
    assert ei.value.type == "ValueError" and ei.value.message == "bad shard"
    assert "fail: remote ValueError: bad shard" in str(ei.value) and "Traceback" in ei.value.remote_traceback
    for name in ("nope", "_secret", "__init__"):
        with pytest.raises(RemoteError, match="AttributeError"):
            client.call(name)
    with pytest.raises(RemoteError, match="TypeError"):            # wrong arguments -> the method's TypeError
        client.call("add", np.ones(2))
    np.testing.assert_array_equal(client.call("add", np.ones(2), np.ones(2)), [2.0, 2.0])


def test_non_json_result_and_kwargs_are_rejected(served):
    client, obj = served
    obj.bad = lambda: {1, 2}                                        # a set is not JSON
    with pytest.raises(RemoteError, match="TypeError"):
        client.call("bad")
    with pytest.raises(TypeError, match="keyword arguments must be JSON"):
        client.call("value", x=np.float32(1.0))
    with pytest.raises(TypeError, match="numpy.ndarray"):
        client.call("echo", [1, 2, 3])
    for bad in (np.array([None]), np.zeros(2, dtype=[("a", "<i4")])):
        with pytest.raises(TypeError, match="not a plain"):
            client.call("echo", bad)


def test_timeout_then_late_reply_is_dropped(served):
    client, _ = served
    with pytest.raises(RpcTimeout, match="no reply to 'sleep'"):
        client.call("sleep", seconds=0.5, timeout_s=0.1)
    time.sleep(0.6)                                                # the late reply arrives on the old socket
    assert client.call("sleep", seconds=0.0) == 0.0                # the next call gets its own reply


def test_link_down_fails_fast_and_sends_nothing(served):
    client, obj = served
    client.set_link_down(True)
    t0 = time.monotonic()
    with pytest.raises(LinkDown):
        client.call("echo", np.ones(3))
    assert time.monotonic() - t0 < 1.0
    assert obj.calls == 0
    client.set_link_down(False)
    client.call("echo", np.ones(3))
    assert obj.calls == 1


def test_dead_worker_gives_clear_error_not_a_hang():
    with RpcClient("tcp://127.0.0.1:9", timeout_s=60.0, alive=lambda: False, name="gone") as c:
        t0 = time.monotonic()
        with pytest.raises(WorkerDead, match="gone: worker process exited"):
            c.call("ping")
        assert time.monotonic() - t0 < 5.0
    with RpcClient("tcp://127.0.0.1:9", timeout_s=0.2) as c:        # nobody listens, no liveness callback
        with pytest.raises(RpcTimeout):
            c.call("ping")


def test_latency_is_added_each_way_and_traced(served):
    client, _ = served
    client.set_latency(0.03)
    x = np.ones((64, 64), dtype=np.float32)
    client.call("echo", x)
    rec = client.drain_trace()[-1]
    assert rec.ok and rec.method == "echo" and rec.latency_s == 0.03
    assert rec.t_send - rec.t_call >= 0.03 and rec.t_done - rec.t_recv >= 0.03      # sleeps are lower bounds
    assert rec.bytes_out > x.nbytes and rec.bytes_in > x.nbytes
    assert client.trace == []
    with pytest.raises(ValueError, match="latency"):
        client.set_latency(-1)


def test_call_async_runs_in_parallel_clients(served):
    client, _ = served
    futs = [client.call_async("add", np.full(3, k), np.ones(3)) for k in range(4)]
    for k, f in enumerate(futs):
        np.testing.assert_array_equal(f.result(timeout=10), np.full(3, k + 1))


def test_decode_rejects_a_wrong_buffer_size():
    meta, frames = encode_arrays([np.ones(4, dtype=np.float32)])
    with pytest.raises(Exception, match="16"):
        decode_arrays(meta, [b"\0" * 8])


# -- the worker process --------------------------------------------------------------------------------------------
def _spawn_worker(port: int, factory: str = FACTORY, args: str = '{"tag": "w"}', extra=()):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen([sys.executable, "-m", "hil.cluster.worker_main", "--bind", f"tcp://127.0.0.1:{port}",
                             "--factory", factory, "--factory-args", args, *extra],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_worker_serves_until_shutdown(tmp_path):
    port = _free_port()
    pid_file = tmp_path / "w.pid"
    p = _spawn_worker(port, extra=("--pid-file", str(pid_file)))
    try:
        with RpcClient(f"tcp://127.0.0.1:{port}", timeout_s=30, alive=lambda: p.poll() is None) as c:
            assert c.call("value")["tag"] == "w"
            assert int(pid_file.read_text()) == p.pid == c.ping()["pid"]
            c.call("shutdown")
        assert p.wait(timeout=10) == 0
    finally:
        p.kill()


def test_worker_exits_on_sigterm():
    port = _free_port()
    p = _spawn_worker(port)
    try:
        with RpcClient(f"tcp://127.0.0.1:{port}", timeout_s=30, alive=lambda: p.poll() is None) as c:
            c.ping()
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=10) == 0
    finally:
        p.kill()


@pytest.mark.parametrize("factory,args,msg", [
    ("tests.hil_cluster.factories:nope", "{}", "has no attribute"),
    ("no_such_module_xyz:f", "{}", "cannot import"),
    ("notaspec", "{}", "must be 'module:callable'"),
    (FACTORY, "[1]", "--factory-args"),
    ("tests.hil_cluster.factories:make_broken", "{}", "factory refuses on purpose"),
])
def test_worker_bad_factory_exits_2_with_one_line(factory, args, msg):
    p = _spawn_worker(_free_port(), factory, args)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 2
    assert err.startswith("error: ") and msg in err and len(err.strip().splitlines()) == 1


def test_worker_exits_when_its_parent_is_killed():
    """A middle process spawns the worker and is SIGKILLed: the worker must go (parent-death signal)."""
    port = _free_port()
    code = (f"import subprocess, sys; p = subprocess.Popen([sys.executable, '-m', 'hil.cluster.worker_main', "
            f"'--bind', 'tcp://127.0.0.1:{port}', '--factory', '{FACTORY}']); print(p.pid, flush=True); "
            f"import time; time.sleep(60)")
    mid = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)),
                           stdout=subprocess.PIPE, text=True)
    try:
        wpid = int(mid.stdout.readline())
        with RpcClient(f"tcp://127.0.0.1:{port}", timeout_s=30) as c:
            c.ping()
        mid.kill()
        mid.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _running(wpid):
            time.sleep(0.05)
        assert not _running(wpid), "worker survived its parent"
    finally:
        mid.kill()


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


@pytest.mark.bench
def test_bench_rpc_round_trip_loopback_process():
    """Measured RPC round trip to a worker process on loopback (no shaping, no latency): 0 B and 576 KiB."""
    port = _free_port()
    p = _spawn_worker(port)
    try:
        with RpcClient(f"tcp://127.0.0.1:{port}", timeout_s=30, alive=lambda: p.poll() is None) as c:
            c.ping()
            res = {}
            for label, arrays in (("0B", ()), ("576KiB", (np.ones((128, 1152), np.float32),))):
                for _ in range(20):
                    c.call("echo", *arrays)
                ts = []
                for _ in range(200):
                    t0 = time.perf_counter()
                    c.call("echo", *arrays)
                    ts.append(time.perf_counter() - t0)
                res[label] = {"median_ms": 1e3 * float(np.median(ts)), "p90_ms": 1e3 * float(np.percentile(ts, 90))}
            c.call("shutdown")
        print("\nmeasured RPC round trip, loopback:", json.dumps(res))
    finally:
        p.kill()


def test_reply_carries_the_workers_own_time_of_the_method(served):
    """`server_s`: the worker's wall time of the method, which the closed loop takes as the device's compute; the
    injected link latency and the transfer are outside it."""
    client, _ = served
    assert np.isnan(client.last_server_s())
    client.set_latency(0.02)
    t0 = time.monotonic()
    client.call("sleep", seconds=0.05)
    wall = time.monotonic() - t0
    s = client.last_server_s()
    assert 0.05 <= s < wall - 0.04 + 1e-3        # the two 20 ms one-way latencies are not the worker's time
    assert client.trace[-1].server_s == s
    with pytest.raises(RemoteError):
        client.call("fail")
    assert np.isnan(client.last_server_s())          # an error reply is not a compute time: not the previous one
