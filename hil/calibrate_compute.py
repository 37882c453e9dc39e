"""Compute and dispatch measurements of the host calibration (docs/hil.md "Host profile"): the runner's kernels
(`Kernels`: native.compute, else labelled NumPy stand-ins), INT8 GEMM vs shape and threads on DRAM-cycled weights,
the GEMM pool's wake-up, float32 elementwise ops, attention, and the thread hand-offs of the runner's dispatch
(idle machine, busy cores, a woken thread on an idle core)."""
from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from typing import TYPE_CHECKING, Callable, Iterator

import numpy as np

import native
from hil.calibrate_stats import Stat, gemm_pool, in_threads, split, timed, timed_after
from native.compute import aligned, aligned_copy

if TYPE_CHECKING:
    from hil.calibrate_settings import CalibrationSettings


# ================================================ compute kernels ====================================================
class Kernels:
    """The compute kernels the HIL runner uses: native.compute (C, SIMD) when it is built, else NumPy stand-ins
    (float32 BLAS matmul etc.; `label` says which, and the profile's sources repeat it)."""

    def __init__(self) -> None:
        try:
            from native import compute as nc
            self.nc = nc
            self.label = "native.compute"
        except Exception as e:               # not built yet / import error: measured NumPy stand-ins, labelled
            self.nc = None
            self.label = f"numpy stand-in (native.compute unavailable: {type(e).__name__})"

    # ---- GEMM: x int8 (M, K), w int8 (N, K) -> out int32 (M, N), output columns [n0, n1) -----------------------
    def gemm_call(self, M: int, K: int, N: int, threads: int, rng: np.random.Generator,
                  weights: list[np.ndarray] | None = None) -> Callable[[], None]:
        """One GEMM call per invocation; with `weights` (copies of an (N, K) matrix) each call takes the next copy,
        so a set larger than the last-level cache makes every call read its weights from DRAM, as a cold-start pass
        (each layer's weights used once per chunk) does."""
        x = aligned_copy(rng.integers(-127, 128, size=(M, K), dtype=np.int8))   # every operand on a cache line,
        ws = weights or [aligned_copy(rng.integers(-127, 128, size=(N, K), dtype=np.int8))]   # as the runner's are
        out = aligned((M, N), np.int32)
        parts = split(N, threads)
        turn = [0]

        def nxt() -> np.ndarray:
            turn[0] = (turn[0] + 1) % len(ws)
            return ws[turn[0]]

        if self.nc is not None:
            if threads > 1:                       # split as the runner splits it: the native pool (hil.runner_ops)
                pool, isa = gemm_pool(threads - 1), self.nc._isa(None)
                raw, h, M_, K_, N_ = pool.raw, pool.handle, int(M), int(K), int(N)

                def run_pool() -> None:
                    w = nxt()
                    rc = raw(h, threads, isa, x.ctypes.data, w.ctypes.data, out.ctypes.data, M_, K_, N_, 0, N_)
                    if rc:
                        raise native.NativeError(f"pool gemm_i8_i32: error {rc}")
                return run_pool
            g = self.nc.gemm_i8_i32

            def run() -> None:
                g(x, nxt(), out)
            return run
        of = out.view(np.float32)

        def run_np() -> None:
            wf = nxt().astype(np.float32)
            in_threads([lambda a=a, b=b: np.matmul(x.astype(np.float32), wf[a:b].T, out=of[:, a:b]) for a, b in parts])
        return run_np

    # ---- float32 elementwise ops: (callable, bytes read + written) ----------------------------------------------
    def elementwise_calls(self, M: int, d: int, rng: np.random.Generator) -> dict[str, tuple[Callable, int]]:
        f32 = np.float32
        x = aligned_copy(rng.standard_normal((M, d)).astype(f32))       # cache-line aligned, as the runner's buffers
        y = aligned_copy(rng.standard_normal((M, d)).astype(f32))
        g = aligned_copy(rng.standard_normal(d).astype(f32))
        o = aligned(x.shape, f32)
        dff = (8 * d // 3 + 63) // 64 * 64
        a = aligned_copy(rng.standard_normal((M, dff)).astype(f32))
        b = aligned_copy(rng.standard_normal((M, dff)).astype(f32))
        of = aligned(a.shape, f32)
        i32 = aligned_copy(rng.integers(-1 << 20, 1 << 20, size=(M, d), dtype=np.int32))
        i8 = aligned((M, d), np.int8)
        scale = aligned_copy(np.full(d, 1e-3, dtype=f32))
        hd = 64
        H = max(1, d // hd)
        q = aligned_copy(rng.standard_normal((M, H, hd)).astype(f32))
        cos = aligned_copy(np.cos(rng.standard_normal((M, hd // 2))).astype(f32))
        sin = aligned_copy(np.sin(rng.standard_normal((M, hd // 2))).astype(f32))
        nb = 4 * M * d
        sizes = dict(rmsnorm=2 * nb + 4 * d, quantize=nb + M * d, dequant=2 * nb + 4 * d, rope=2 * 4 * M * H * hd
                     + 2 * 4 * M * hd // 2, silu_mul=3 * 4 * M * dff, add=3 * nb)
        nc = self.nc
        if nc is not None:
            calls = dict(
                rmsnorm=lambda: nc.rmsnorm(x, g, 1e-5, out=o),
                quantize=lambda: nc.quantize_i8(x, 0.05, out=i8),
                dequant=lambda: nc.dequant_i32(i32, 0.05, scale, out=o),
                rope=lambda: nc.rope(q, cos, sin),
                silu_mul=lambda: nc.silu_mul(a, b, out=of),
                add=lambda: nc.add(x, y, out=o))
        else:
            def rms() -> None:
                np.multiply(x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5), g, out=o)

            def quant() -> None:
                np.clip(np.rint(x / 0.05), -127, 127, out=o)
                i8[...] = o

            def rope() -> None:
                e, od = q[..., 0::2], q[..., 1::2]
                c, s_ = cos[:, None, :], sin[:, None, :]
                e2 = e * c - od * s_
                q[..., 1::2] = e * s_ + od * c
                q[..., 0::2] = e2

            calls = dict(rmsnorm=rms, quantize=quant,
                         dequant=lambda: np.multiply(i32 * np.float32(0.05), scale, out=o),
                         rope=rope, silu_mul=lambda: np.multiply(a / (1 + np.exp(-a)), b, out=of),
                         add=lambda: np.add(x, y, out=o))
        return {k: (calls[k], sizes[k]) for k in calls}

    # ---- attention: q (m, H, hd), caches (ctx_cap, KV, hd) -> out (m, H*hd); FLOPs 4 m ctx H hd --------------
    def attention_call(self, m: int, past: int, H: int, KV: int, hd: int, rng: np.random.Generator
                       ) -> tuple[Callable[[], None], float]:
        cap = past + m
        q = aligned_copy(rng.standard_normal((m, H, hd)).astype(np.float32))      # cache-line aligned (runner)
        k = aligned_copy(rng.standard_normal((cap, KV, hd)).astype(np.float32))
        v = aligned_copy(rng.standard_normal((cap, KV, hd)).astype(np.float32))
        out = aligned((m, H * hd), np.float32)
        ctx = past + (m + 1) / 2                                    # mean keys per query (causal)
        flops = 4.0 * m * ctx * H * hd
        if self.nc is not None:
            return (lambda: self.nc.attention(q, k, v, past, out=out)), flops
        rep = H // KV

        def ref() -> None:
            kk = np.repeat(k, rep, axis=1)                          # (cap, H, hd)
            vv = np.repeat(v, rep, axis=1)
            sc = np.einsum("mhd,chd->hmc", q, kk) / math.sqrt(hd)   # (H, m, cap)
            mask = np.arange(cap)[None, :] > (past + np.arange(m))[:, None]
            sc[:, mask] = -np.inf
            sc = np.exp(sc - sc.max(-1, keepdims=True))
            sc /= sc.sum(-1, keepdims=True)
            out[...] = np.einsum("hmc,chd->mhd", sc, vv).reshape(m, H * hd)
        return ref, flops


def measure_gemm(k: Kernels, s: CalibrationSettings) -> list[dict]:
    """Rows {m, k, n, threads, seconds, spread, gops}: INT8 GEMM (M, K) x (N, K)^T, N split over threads; weights
    cycled through `cold_set_bytes` of copies (read from DRAM, as in a cold start, not from a warm cache)."""
    rng = np.random.default_rng(3)
    rows = []
    for K, N in s.gemm_kn:
        base = aligned_copy(rng.integers(-127, 128, size=(N, K), dtype=np.int8))
        copies = [base] + [aligned_copy(base) for _ in range(max(1, -(-s.cold_set_bytes // base.nbytes)) - 1)]
        for M in s.gemm_m:
            for th in s.threads:
                st = timed(k.gemm_call(M, K, N, th, rng, copies), s.reps, budget_s=s.gemm_budget_s)
                rows.append(dict(m=M, k=K, n=N, threads=th, seconds=st.expected, spread=st.spread,
                                 gops=2.0 * M * K * N / st.expected / 1e9))
    return rows


def measure_pool_wake(k: Kernels, s: CalibrationSettings) -> Stat | None:
    """Seconds a 2-thread GEMM (16 x 576 x 1536, weights cycled through DRAM, the runner's pool:
    `hil.runner_state.gemm_pool`) takes longer when its helper sleeps than when it still polls after the previous
    GEMM: each call timed once right after another (the helper polling) and once after this thread stayed busy in
    Python for three poll windows (the helper asleep, its core halted, as between a run's GEMMs that are far apart);
    median difference, >= 0. None with one CPU or without the native kernels."""
    from hil.runner_state import POOL_SPIN_US

    if k.nc is None or (os.cpu_count() or 1) < 2:
        return None
    call = layer_gemm(k, s, np.random.default_rng(6), threads=2)
    gap = 3 * POOL_SPIN_US * 1e-6

    def busy() -> None:
        end = time.perf_counter() + gap
        while time.perf_counter() < end:
            pass

    awake = timed_after(call, call, max(s.reps, 25))
    asleep = timed_after(call, lambda: (call(), busy()), max(s.reps, 25))
    return Stat(max(0.0, asleep.median - awake.median), max(awake.spread, asleep.spread), asleep.n)


def layer_gemm(k: Kernels, s: CalibrationSettings, rng: np.random.Generator, threads: int = 1
               ) -> Callable[[], None]:
    """A 16 x 576 x 1536 INT8 GEMM on weights cycled through `cold_set_bytes` (from DRAM) on `threads` threads (the
    runner's pool beyond one): what runs between a layer's elementwise ops in a cold start, streaming that layer's
    weights through the caches."""
    base = aligned_copy(rng.integers(-127, 128, size=(1536, 576), dtype=np.int8))
    copies = [base] + [aligned_copy(base) for _ in range(max(1, -(-s.cold_set_bytes // base.nbytes)) - 1)]
    return k.gemm_call(16, 576, 1536, threads, rng, copies)


def measure_elementwise(k: Kernels, s: CalibrationSettings) -> list[dict]:
    """Rows {op, m, d, bytes, seconds, spread} of the float32 elementwise ops, 1 thread, each call timed right after
    a layer GEMM (`layer_gemm`), as in a cold start: timed back to back in a loop they ran 1.5-2x faster than in the
    runner (rmsnorm 16 x 576: 9.5 us hot, 14.8 right after a GEMM, 22.8 after a 2 MB copy; median 27 in a
    llama.cpp-style SmolLM2 run)."""
    rng = np.random.default_rng(4)
    pre = layer_gemm(k, s, rng)
    rows = []
    for d in s.elem_dims:
        for M in s.elem_rows:
            for op, (fn, nb) in k.elementwise_calls(M, d, rng).items():
                st = timed_after(fn, pre, max(s.reps, s.elem_context_reps))
                rows.append(dict(op=op, m=M, d=d, bytes=int(nb), seconds=st.expected, spread=st.spread))
    return rows


def measure_attention(k: Kernels, s: CalibrationSettings) -> list[dict]:
    """Rows {m, past, heads, kv_heads, head_dim, flops, seconds, spread}, 1 thread, each call right after a layer
    GEMM (as `measure_elementwise`)."""
    rng = np.random.default_rng(5)
    pre = layer_gemm(k, s, rng)
    rows = []
    for m, past, H, KV, hd in s.attn_shapes:
        fn, flops = k.attention_call(m, past, H, KV, hd, rng)
        st = timed_after(fn, pre, max(s.reps, s.elem_context_reps))
        rows.append(dict(m=m, past=past, heads=H, kv_heads=KV, head_dim=hd, flops=flops, seconds=st.expected,
                         spread=st.spread))
    return rows


@contextlib.contextmanager
def busy_cores(n: int) -> Iterator[list[int]]:
    """`n` CPU-bound threads (native INT8 GEMM calls, GIL released; a NumPy loop without the native library) for
    the duration of the block; yields their per-thread call counters (work done)."""
    stop = threading.Event()
    k = Kernels()
    counts = [0] * n

    def spin(i: int) -> None:
        call = k.gemm_call(16, 576, 576, 1, np.random.default_rng(7 + i))
        while not stop.is_set():
            call()
            counts[i] += 1

    threads = [threading.Thread(target=spin, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    time.sleep(0.05)
    try:
        yield counts
    finally:
        stop.set()
        for t in threads:
            t.join()


# ================================================ dispatch ===========================================================
def measure_dispatch_busy(s: CalibrationSettings) -> Stat:
    """`measure_dispatch` while one CPU-bound thread per core runs short native calls from a Python loop (the
    runner's other threads: each woken thread first waits for a time slice and for the interpreter lock)."""
    with busy_cores(len(os.sched_getaffinity(0))):
        return measure_dispatch(s)


def measure_dispatch(s: CalibrationSettings, worker_cpu: list[float] | None = None) -> Stat:
    """Seconds per task of a hand-off to a worker thread through a threading.Condition and back (post a task, the
    worker runs it — a no-op — and posts completion, the dispatcher wakes): the runner's per-task cost. With
    `worker_cpu`, the worker thread's CPU seconds per hand-off (being woken, re-taking the lock and the interpreter
    lock, notifying back, going to sleep) are appended to it."""
    cond = threading.Condition()
    state = {"task": 0, "done": 0, "stop": False}

    def worker() -> None:
        c0 = time.thread_time()
        with cond:
            while True:
                while state["task"] == state["done"] and not state["stop"]:
                    cond.wait()
                if state["stop"]:
                    if worker_cpu is not None and state["done"] > 0:
                        worker_cpu.append((time.thread_time() - c0) / state["done"])
                    return
                state["done"] += 1
                cond.notify_all()

    t = threading.Thread(target=worker, daemon=True)
    t.start()

    def round_trips() -> None:
        for _ in range(s.dispatch_tasks):
            with cond:
                state["task"] += 1
                cond.notify_all()
                while state["done"] != state["task"]:
                    cond.wait()

    try:
        st = timed(round_trips, s.reps)
    finally:
        with cond:
            state["stop"] = True
            cond.notify_all()
        t.join()
    return Stat(st.median / s.dispatch_tasks, st.spread, st.n)


def _hand_off(cond: threading.Condition, st: dict, work: Callable[[], None], mark: Callable[[], object]) -> None:
    """One hand-off of the wake-up probes: under `cond`, `mark()` (what the probe records at the notify), post a task
    (`st["task"]`) and notify; then the waker keeps computing (`work`) and waits until the task is done."""
    with cond:
        mark()
        st["task"] += 1
        cond.notify_all()
    work()
    with cond:
        while st["done"] != st["task"]:
            cond.wait()


PACK_GAPS_US = (0, 20, 50, 100, 200, 500, 1000, 2000)   # us both threads sleep before a hand-off (below)


def measure_wake_pack(k: "Kernels", s: CalibrationSettings, hand_offs: int = 60) -> list[dict] | None:
    """Where the OS puts a thread woken while its waker keeps computing, by how long the other core had been idle:
    neither thread pinned (the runner's are not), a worker hands a task (one layer GEMM) to a sleeping thread
    through a threading.Condition and goes on computing (one layer GEMM), both having slept a gap of `PACK_GAPS_US`
    before (their vCPUs halted; `hand_offs` per gap, the gaps in a seeded shuffled order so that one placement
    does not decide the next ones of its gap). Per gap: `idle_s`, the median time the woken thread had been asleep
    at the notify, and `share`, the share of its hand-offs whose woken thread started on its waker's CPU
    (sched_getcpu) — put on the busy core while another idled (docs/hil.md "Wake-up packing"). None on one core or
    without sched_getcpu."""
    import ctypes

    if len(os.sched_getaffinity(0)) < 2:
        return None
    try:
        getcpu = ctypes.CDLL(None).sched_getcpu
    except (OSError, AttributeError):
        return None
    mine = layer_gemm(k, s, np.random.default_rng(5))
    theirs = layer_gemm(k, s, np.random.default_rng(7))
    gaps = np.repeat(np.array(PACK_GAPS_US), hand_offs)
    np.random.default_rng(11).shuffle(gaps)
    cond = threading.Condition()
    st = {"task": 0, "done": 0, "stop": False, "cpu": -1, "asleep": 0.0}
    same: list[bool] = []

    def worker() -> None:
        with cond:
            while True:
                st["asleep"] = time.perf_counter()
                while st["task"] == st["done"] and not st["stop"]:
                    cond.wait()
                if st["stop"]:
                    return
                same.append(getcpu() == st["cpu"])
                cond.release()
                try:
                    theirs()
                finally:
                    cond.acquire()
                st["done"] += 1
                cond.notify_all()

    idle: list[float] = []
    th = threading.Thread(target=worker, daemon=True)
    th.start()
    try:
        for gap_us in gaps:
            time.sleep(float(gap_us) * 1e-6)
            _hand_off(cond, st, mine, lambda: (idle.append(time.perf_counter() - st["asleep"]),
                                               st.__setitem__("cpu", getcpu())))
    finally:
        with cond:
            st["stop"] = True
            cond.notify_all()
        th.join()
    sel = {g: gaps == g for g in PACK_GAPS_US}
    return [dict(gap_us=int(g), idle_s=float(np.median(np.array(idle)[m])), share=float(np.mean(np.array(same)[m])))
            for g, m in sel.items()]


def pack_threshold(rows: list[dict]) -> tuple[float, float]:
    """(idle s from which wake-ups are packed, share packed from there) of a `measure_wake_pack` curve: the
    least-squares step — no packing below some idle time, a constant share from it on — over the curve's points
    sorted by idle time (each step at a measured point; the share is the mean from there, the points below count as
    0). (0, 0) when no step fits better than no packing at all. A step, not a threshold on the share: the measured
    share is often flat over idle time (measured: 0.77-0.90 from 57 us on one VM, 0.07-0.13 or 0.43-0.57 at every
    idle time on another; docs/hil.md "Wake-up packing"), and a fixed cut such as "every share from there >= 0.5"
    turns a share near the cut into all or nothing."""
    pts = sorted(rows, key=lambda r: r["idle_s"])
    s = np.array([r["share"] for r in pts], dtype=np.float64)
    best_sse, idle, share = float(np.sum(s ** 2)), 0.0, 0.0           # no packing
    for i in range(len(pts)):
        p = float(s[i:].mean())
        sse = float(np.sum(s[:i] ** 2) + np.sum((s[i:] - p) ** 2))
        if sse < best_sse - 1e-12:
            best_sse, idle, share = sse, float(pts[i]["idle_s"]), p
    return idle, share


def measure_wake_idle_core(k: "Kernels", s: CalibrationSettings) -> Stat | None:
    """Seconds from a notify through a threading.Condition until the woken thread runs, when its waker keeps
    computing (one layer GEMM, the interpreter lock released) and the woken thread is pinned to another, idle core
    (on a VM a halted vCPU, woken by an interrupt first): the runner's hand-offs between its compute workers, whose
    waker goes on to its next op. `measure_dispatch`'s ping-pong measures the other case — the waker sleeps at once
    and leaves the woken thread its own core. Mean per hand-off; None on one core."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    rng = np.random.default_rng(5)
    work = layer_gemm(k, s, rng)
    n = max(50, s.dispatch_tasks // 4)
    vals = []
    for _ in range(s.reps):
        cond = threading.Condition()
        st = {"task": 0, "done": 0, "stop": False}
        delays: list[float] = []
        sent = [0.0]

        def worker() -> None:
            os.sched_setaffinity(0, {cpus[1]})
            with cond:
                while True:
                    while st["task"] == st["done"] and not st["stop"]:
                        cond.wait()
                    if st["stop"]:
                        return
                    delays.append(time.perf_counter() - sent[0])
                    st["done"] += 1
                    cond.notify_all()

        th = threading.Thread(target=worker, daemon=True)
        th.start()
        mask = os.sched_getaffinity(0)
        try:
            os.sched_setaffinity(0, {cpus[0]})
            for _ in range(n):
                _hand_off(cond, st, work, lambda: sent.__setitem__(0, time.perf_counter()))
        finally:
            os.sched_setaffinity(0, mask)
            with cond:
                st["stop"] = True
                cond.notify_all()
            th.join()
        vals.append(float(np.mean(delays)))
    return Stat.of(vals)


