"""pyzmq RPC between the controller and the emulated devices' workers, with user-space link latency and a per-message
trace (Voltron §3.2.1: devices exchange activations over Wi-Fi Direct; §3.2.3: latency grows and links drop as the
RSSI falls). See docs/cluster.md ("Emulated cluster: plumbing").

Wire format, one zmq multipart message each way (client DEALER <-> server ROUTER, no envelope delimiter):

    request : [header JSON, buf_0, …, buf_{k-1}]  header = {"id", "method", "kwargs", "arrays": [{"dtype", "shape"}]}
    reply   : [header JSON, buf_0, …]             header = {"id", "ok": true, "kind", "value", "arrays": [...],
                                                            "server_s"}
                                                  or {"id", "ok": false, "error": {"type", "message", "traceback"}}

`server_s` is the worker's own wall time of the method (monotonic clock, decode to encode): the device's compute of
that call; the rest of the call as the client times it is the message (latency, transfer, RPC). The client keeps the
last one per thread (`last_server_s`).

Arrays travel as raw C-order buffers (no pickling): sent with `copy=False` above `ZERO_COPY_MIN` bytes, received as
writable NumPy views of the zmq frames (no copy). A method is called as `obj.<method>(*arrays, **kwargs)` and may return
None / a JSON value, an ndarray, a list or tuple of ndarrays, or a `Payload(value, arrays)`; the client gets the same
shape back. A method raising gives `RemoteError(type, message)` on the client.

Latency: the client sleeps the link's one-way latency (`set_latency(s)`, monotonic clock) before sending each request
and again after receiving each reply; the bytes themselves are shaped by tc tbf in the kernel (netns.py).
`set_link_down(True)` makes calls fail fast with `LinkDown`. A worker that does not answer within the timeout, or
whose process is gone (`alive` callback), gives `WorkerDead` / `RpcTimeout`: a call never hangs. After such a failure
the client drops its socket (a request still queued there is discarded), but a request already delivered may still
run on the worker: the caller treats the worker's state as unknown.
"""
from __future__ import annotations

import itertools
import json
import os
import threading
import time
import traceback
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import zmq

ZERO_COPY_MIN = 64 * 1024      # bytes: smaller buffers are copied (zmq's zero-copy bookkeeping costs more)
POLL_SLICE_S = 0.05            # s, how often a waiting client re-checks `alive` / a server checks its stop flag
BUILTINS = ("ping", "shutdown")


# -- errors ------------------------------------------------------------------------------------------------------------
class RpcError(RuntimeError):
    """Base of every transport error."""


class RemoteError(RpcError):
    """The remote method raised; `type` and `message` are the remote exception's, `remote_traceback` its traceback."""

    def __init__(self, method: str, type_: str, message: str, remote_traceback: str = ""):
        super().__init__(f"{method}: remote {type_}: {message}")
        self.type, self.message, self.remote_traceback = type_, message, remote_traceback


class LinkDown(RpcError):
    """The link to this worker is down (emulated disconnect): the controller should re-plan."""


class RpcTimeout(RpcError):
    """No reply within the timeout."""


class WorkerDead(RpcError):
    """The worker process is gone."""


# -- payload encoding ------------------------------------------------------------------------------------------------
@dataclass
class Payload:
    """A JSON value plus arrays, for a method that returns both."""
    value: Any = None
    arrays: list[np.ndarray] = field(default_factory=list)


def encode_arrays(arrays) -> tuple[list[dict], list]:
    """(array metadata for the header, frames to send) for a sequence of ndarrays."""
    meta, frames = [], []
    for k, a in enumerate(arrays):
        if not isinstance(a, np.ndarray):
            raise TypeError(f"array {k}: expected a numpy.ndarray, got {type(a).__name__}")
        if a.dtype.hasobject or a.dtype.names is not None or a.dtype.subdtype is not None:
            raise TypeError(f"array {k}: dtype {a.dtype} is not a plain (numeric, bool, datetime) dtype")
        a = a if a.flags.c_contiguous else np.array(a, order="C")     # (ascontiguousarray makes 0-d 1-d)
        meta.append({"dtype": a.dtype.str, "shape": list(a.shape)})
        frames.append(a)
    return meta, frames


def decode_arrays(meta: list[dict], frames: list) -> list[np.ndarray]:
    """Writable ndarrays viewing the received zmq frames (no copy)."""
    if len(meta) != len(frames):
        raise RpcError(f"message has {len(frames)} buffers but its header describes {len(meta)}")
    out = []
    for k, (m, f) in enumerate(zip(meta, frames)):
        dt, shape = np.dtype(m["dtype"]), tuple(m["shape"])
        buf = f.buffer if isinstance(f, zmq.Frame) else f
        want = dt.itemsize * int(np.prod(shape, dtype=np.int64))
        if len(buf) != want:       # memoryview of bytes: len = nbytes
            raise RpcError(f"array {k}: {len(buf)} bytes received, header says {shape} {dt} = {want} bytes")
        out.append(np.frombuffer(buf, dtype=dt).reshape(shape))
    return out


def _send(sock: zmq.Socket, parts: list, track: bool = False):
    """Send header + arrays; large arrays without a copy. Returns the zmq MessageTracker when `track`."""
    nbytes = 0
    tracker = None
    for k, p in enumerate(parts):
        more = zmq.SNDMORE if k < len(parts) - 1 else 0
        if isinstance(p, np.ndarray):
            nbytes += p.nbytes
            zc = p.nbytes >= ZERO_COPY_MIN
            raw = p.reshape(-1).view(np.uint8) if p.nbytes else b""          # (nbytes,) uint8 view, no copy
            r = sock.send(raw, more, copy=not zc, track=track and zc)
            if track and zc:
                tracker = r
        else:
            nbytes += len(p)
            sock.send(p, more)
    return nbytes, tracker


def _frames_nbytes(frames) -> int:
    return sum(len(f.buffer) if isinstance(f, zmq.Frame) else len(f) for f in frames)


# -- server ------------------------------------------------------------------------------------------------------------
class RpcServer:
    """Serve `obj`'s public methods on a zmq ROUTER socket, one request at a time.

    Built-in methods: `ping` (-> {"pid", "methods"}) and `shutdown` (replies, then `serve_forever` returns)."""

    def __init__(self, obj: Any, bind: str, *, context: zmq.Context | None = None):
        self.obj = obj
        self.ctx = context or zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 1000)      # ms: let the last reply (e.g. to `shutdown`) leave
        self.sock.bind(bind)
        self.endpoint = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._stop = threading.Event()
        self._pending = None                         # tracker of the last zero-copy reply still being sent

    def stop(self) -> None:
        """Ask `serve_forever` to return (thread- and signal-safe)."""
        self._stop.set()

    def serve_forever(self, should_stop: Callable[[], bool] | None = None) -> None:
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        while not self._stop.is_set() and not (should_stop and should_stop()):
            if not poller.poll(int(POLL_SLICE_S * 1000)):
                continue
            frames = self.sock.recv_multipart(copy=False)
            self._handle(frames)

    def _handle(self, frames: list) -> None:
        if len(frames) < 2:               # not a request of ours (identity + header at least): ignore it
            return
        ident, head, bufs = frames[0], frames[1], frames[2:]
        rid, method = None, "?"
        try:
            req = json.loads(bytes(head.buffer))
            rid, method = req.get("id"), req.get("method", "?")
            t0 = time.monotonic()
            arrays = decode_arrays(req.get("arrays", []), bufs)
            result = self._dispatch(method, arrays, req.get("kwargs") or {})
            header, out = _encode_result(rid, result)
            header["server_s"] = time.monotonic() - t0
        except BaseException as e:          # everything travels back; the server keeps serving
            if isinstance(e, KeyboardInterrupt):
                raise
            header = {"id": rid, "ok": False,
                      "error": {"type": type(e).__name__, "message": str(e), "traceback": traceback.format_exc()}}
            out = []
        self._wait_pending()
        _, self._pending = _send(self.sock, [ident.bytes, json.dumps(header).encode(), *out], track=True)
        if method == "shutdown" and header.get("ok"):
            self._stop.set()

    def _dispatch(self, method: str, arrays: list[np.ndarray], kwargs: dict) -> Any:
        if method == "ping":
            return {"pid": os.getpid(), "methods": _public_methods(self.obj)}
        if method == "shutdown":
            return None
        if not isinstance(method, str) or method.startswith("_") or method in BUILTINS:
            raise AttributeError(f"no RPC method {method!r}")
        fn = getattr(self.obj, method, None)
        if not callable(fn):
            raise AttributeError(f"{type(self.obj).__name__} has no method {method!r}")
        return fn(*arrays, **kwargs)

    def _wait_pending(self) -> None:
        """A zero-copy reply's arrays stay owned by zmq until sent: wait for that before running the next method
        (which might overwrite a buffer it returned), unless asked to stop."""
        while self._pending is not None and not self._stop.is_set():
            try:
                self._pending.wait(timeout=POLL_SLICE_S)
                self._pending = None
            except zmq.NotDone:
                continue

    def close(self) -> None:
        self.sock.close(linger=1000)


def _encode_result(rid, result) -> tuple[dict, list]:
    if isinstance(result, Payload):
        kind, value, arrays = "payload", result.value, result.arrays
    elif isinstance(result, np.ndarray):
        kind, value, arrays = "array", None, [result]
    elif isinstance(result, (list, tuple)) and result and all(isinstance(a, np.ndarray) for a in result):
        kind, value, arrays = "arrays", None, list(result)
    else:
        kind, value, arrays = "value", result, []
    meta, frames = encode_arrays(arrays)
    header = {"id": rid, "ok": True, "kind": kind, "value": value, "arrays": meta}
    json.dumps(header)      # a non-JSON return value fails here, on the server, with a clear TypeError
    return header, frames


def _decode_result(header: dict, arrays: list[np.ndarray]):
    kind = header.get("kind")
    if kind == "array":
        return arrays[0]
    if kind == "arrays":
        return arrays
    if kind == "payload":
        return Payload(header.get("value"), arrays)
    return header.get("value")


def _public_methods(obj) -> list[str]:
    return sorted(n for n in dir(obj) if not n.startswith("_") and callable(getattr(obj, n, None)))


# -- client ------------------------------------------------------------------------------------------------------------
@dataclass
class MessageRecord:
    """One call as seen by the client (times: time.monotonic() s of the controller process)."""
    method: str
    bytes_out: int          # bytes of the request (header + arrays)
    bytes_in: int           # bytes of the reply (0 if none)
    t_call: float           # call() entered
    t_send: float           # request handed to zmq (after the one-way latency)
    t_recv: float           # reply received (before the return latency); nan if none
    t_done: float           # call() returned or raised
    latency_s: float        # one-way latency applied each way
    ok: bool
    error: str = ""
    server_s: float = float("nan")   # the worker's wall time of the method (reply header); nan if no reply


class RpcClient:
    """Calls methods of one worker: `call(method, *arrays, **kwargs)`. Thread-safe (calls are serialised); use one
    client per worker and `call_async` or threads to talk to several workers at once."""

    _ids = itertools.count(1)

    def __init__(self, endpoint: str, *, timeout_s: float = 30.0, alive: Callable[[], bool] | None = None,
                 name: str = "", context: zmq.Context | None = None, keep_trace: bool = True):
        if not (timeout_s > 0):
            raise ValueError(f"timeout_s: must be > 0, got {timeout_s!r}")
        self.endpoint, self.timeout_s, self.alive, self.name = endpoint, float(timeout_s), alive, name or endpoint
        self.ctx = context or zmq.Context.instance()
        self._connect()
        self.latency_s = 0.0
        self.link_down = False
        self.keep_trace = keep_trace
        self.trace: list[MessageRecord] = []
        self._lock = threading.Lock()
        self._tls = threading.local()            # per calling thread: the last call's `server_s`
        self._pool: ThreadPoolExecutor | None = None
        self._closed = False

    # -- link emulation ------------------------------------------------------------------------------------------
    def set_latency(self, seconds: float) -> None:
        if not (seconds >= 0 and seconds < 60):
            raise ValueError(f"latency: must be in [0, 60) s, got {seconds!r}")
        self.latency_s = float(seconds)

    def set_link_down(self, down: bool) -> None:
        self.link_down = bool(down)

    # -- calls ---------------------------------------------------------------------------------------------------
    def call(self, method: str, *arrays: np.ndarray, timeout_s: float | None = None, **kwargs):
        """Call `method(*arrays, **kwargs)` on the worker and return its result (see module docstring).

        Raises LinkDown (link down: immediately), RemoteError, RpcTimeout or WorkerDead."""
        if self.link_down:
            raise LinkDown(f"{self.name}: link down; {method} not sent")
        if self._closed:
            raise RpcError(f"{self.name}: client closed")
        timeout = self.timeout_s if timeout_s is None else float(timeout_s)
        meta, frames = encode_arrays(arrays)
        rid = next(self._ids)
        try:
            head = json.dumps({"id": rid, "method": method, "kwargs": kwargs, "arrays": meta}).encode()
        except TypeError as e:
            raise TypeError(f"{method}: keyword arguments must be JSON values ({e}); "
                            "send arrays positionally") from None
        with self._lock:
            t_call = time.monotonic()
            lat = self.latency_s
            rec = MessageRecord(method, 0, 0, t_call, float("nan"), float("nan"), float("nan"), lat, False)
            try:
                _sleep_until(t_call + lat)
                if self.link_down:                   # went down while the request was "in the air"
                    raise LinkDown(f"{self.name}: link down; {method} not sent")
                rec.t_send = time.monotonic()
                rec.bytes_out, _ = _send(self.sock, [head, *frames])
                try:
                    reply = self._wait_reply(rid, method, rec.t_send + timeout, timeout)
                except RpcError:
                    self._reset_socket()      # drop the request if it is still queued: it must not run later
                    raise
                rec.t_recv = time.monotonic()
                rec.bytes_in = _frames_nbytes(reply)
                _sleep_until(rec.t_recv + lat)
                header = json.loads(bytes(reply[0].buffer))
                rec.server_s = float(header.get("server_s", float("nan")))
                if not header.get("ok"):
                    err = header.get("error") or {}
                    raise RemoteError(method, err.get("type", "?"), err.get("message", ""), err.get("traceback", ""))
                result = _decode_result(header, decode_arrays(header.get("arrays", []), reply[1:]))
                rec.ok = True
                return result
            except BaseException as e:
                rec.error = f"{type(e).__name__}: {e}"
                raise
            finally:
                rec.t_done = time.monotonic()
                self._tls.server_s = rec.server_s
                if self.keep_trace:
                    self.trace.append(rec)

    def last_server_s(self) -> float:
        """The worker's wall time of the calling thread's last call (nan: none, or it got no reply)."""
        return float(getattr(self._tls, "server_s", float("nan")))

    def call_async(self, method: str, *arrays: np.ndarray, **kwargs) -> Future:
        """`call` on this client's own thread; returns a Future (arrays must not be modified until it is done)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"rpc-{self.name}")
        return self._pool.submit(self.call, method, *arrays, **kwargs)

    def ping(self, timeout_s: float | None = None) -> dict:
        return self.call("ping", timeout_s=timeout_s)

    def _wait_reply(self, rid: int, method: str, deadline: float, timeout: float) -> list:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RpcTimeout(f"{self.name}: no reply to {method!r} within {timeout:.3g} s "
                                 f"(worker busy, dead or unreachable)")
            if self.poller.poll(int(min(left, POLL_SLICE_S) * 1000) + 1):
                frames = self.sock.recv_multipart(copy=False)
                try:
                    got = json.loads(bytes(frames[0].buffer)).get("id")
                except ValueError:
                    got = None
                if got == rid:
                    return frames
                continue                        # a late reply to an earlier, timed-out call: drop it
            if self.link_down:
                raise LinkDown(f"{self.name}: link went down while waiting for {method!r}")
            if self.alive is not None and not self.alive():
                raise WorkerDead(f"{self.name}: worker process exited while {method!r} was pending")

    def _connect(self) -> None:
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(self.endpoint)
        self.poller = zmq.Poller()
        self.poller.register(self.sock, zmq.POLLIN)

    def _reset_socket(self) -> None:
        self.sock.close(linger=0)
        self._connect()

    def drain_trace(self) -> list[MessageRecord]:
        out, self.trace = self.trace, []
        return out

    def close(self) -> None:
        """Idempotent; never blocks (linger 0)."""
        if self._closed:
            return
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        self.sock.close(linger=0)

    @property
    def busy(self) -> bool:
        return self._lock.locked()

    def __enter__(self) -> RpcClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _sleep_until(t: float) -> None:
    """Sleep until monotonic time `t` (no busy wait: the cores are shared with the emulated devices)."""
    while (left := t - time.monotonic()) > 0:
        time.sleep(left)
