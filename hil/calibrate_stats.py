"""Timing statistics and helpers of the host calibration (docs/hil.md "Host profile"): `Stat` (median, spread and the
expected cost per call without preemptions), `timed` / `timed_after`, parallel calls on persistent threads
(`in_threads`), the runner's native GEMM pool as the calibration uses it, the first-touch probe (`touch_cpu`)."""
from __future__ import annotations

import atexit
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import numpy as np

import native

KIB, MIB = 1 << 10, 1 << 20


# ================================================ statistics =========================================================
PREEMPTED_X = 3.0     # 1, a timed call over this many times the median was preempted (another thread ran)


@dataclass
class Stat:
    """Median of repeated timings (s), their spread and, from `of`, their expected value.

    `expected` is what a run pays per call on average: the mean of the calls, those over `PREEMPTED_X` x the median
    left out (preemptions: time another thread ran, which the simulator's core sharing charges on its own). On a
    shared host the median is the typical call, not the average one: this 2-vCPU VM runs ~1.45x slower in bursts
    (a 16 x 576 x 1536 GEMM timed in 6,651 windows of 20 calls over 20 s: 78 % of windows at 130-150 us, 21 % at
    170-210 us, slow bursts lasting 3 ms median, 18 ms p90; measured), and a cold start of 0.15-1.5 s sums its
    kernels' costs over many bursts: calls of one kernel timed back to back gave mean / median 1.02-1.06
    (docs/hil.md "Host profile")."""
    median: float          # s
    spread: float          # 1, (max - min) / median
    n: int
    mean: float | None = None   # s, the mean of the calls within PREEMPTED_X x the median (None: median only)

    @classmethod
    def of(cls, samples: list[float]) -> "Stat":
        a = np.asarray(samples, dtype=np.float64)
        med = float(np.median(a))
        kept = a[a <= PREEMPTED_X * med] if med > 0 else a
        return cls(med, float(np.ptp(a) / med) if med > 0 else 0.0, int(a.size), float(kept.mean()))

    @property
    def expected(self) -> float:
        """s, the expected cost per call (the mean without preemptions; the median where no mean was taken)."""
        return self.median if self.mean is None else self.mean


def timed(fn: Callable[[], object], reps: int, warm: bool = True, budget_s: float = 0.0) -> Stat:
    """Wall times (s) of `reps` calls of fn as a `Stat` (one untimed warm-up call first unless warm=False); with
    `budget_s`, as many more calls as fit in that time (at most 200): short noisy timings get more samples."""
    if warm:
        t0 = time.perf_counter()
        fn()
        if budget_s > 0:
            reps = max(reps, min(200, int(budget_s / max(time.perf_counter() - t0, 1e-9))))
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return Stat.of(ts)


def timed_after(fn: Callable[[], object], before: Callable[[], object], reps: int) -> Stat:
    """Wall times (s) of `reps` calls of fn as a `Stat`, each right after an untimed call of `before` (the work that
    precedes fn in the run: its caches are then as cold as in the run, not warm from the previous call of fn)."""
    before()
    fn()
    ts = []
    for _ in range(reps):
        before()
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return Stat.of(ts)


_POOL: ThreadPoolExecutor | None = None


def in_threads(calls: list[Callable[[], object]]) -> None:
    """Run the calls in parallel (native calls release the GIL): the first in this thread, the others on persistent
    pool threads (no thread creation inside a timing; what a runner with long-lived workers pays); re-raise errors."""
    global _POOL
    if len(calls) > 1 and _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=8, thread_name_prefix="calibrate")
    futs = [_POOL.submit(c) for c in calls[1:]] if len(calls) > 1 else []
    try:
        calls[0]()
    finally:
        for f in futs:
            f.result()


_GEMM_POOLS: dict = {}


def gemm_pool(helpers: int):
    """A native GEMM pool with `helpers` threads and the runner's settings (`hil.runner_state.gemm_pool`), kept for
    the process (the runner's pool lives for a run: its threads exist before any GEMM is timed); closed at exit."""
    pool = _GEMM_POOLS.get(helpers)
    if pool is None:
        from hil.runner_state import gemm_pool as runner_pool

        if not _GEMM_POOLS:
            atexit.register(lambda: [p.close() for p in _GEMM_POOLS.values()])
        pool = _GEMM_POOLS[helpers] = runner_pool(helpers)
    return pool


def touch_cpu(k: int, keep: list | None = None) -> float:
    """Thread CPU seconds per byte of copying into `k` fresh 1 MiB mappings (`hil.runner_state.fresh_empty`, as the
    runner allocates its tensors: page faults + zeroing + the copy); with `keep`, the buffers are appended to it, so
    a later call cannot reuse their pages."""
    from hil.runner_state import fresh_empty

    src = np.ones(MIB, dtype=np.uint8)
    bufs = [fresh_empty(MIB) for _ in range(k)]
    c0 = time.thread_time()
    for b in bufs:
        native.memcpy(b, src)
    cpu = time.thread_time() - c0
    if keep is not None:
        keep.append(bufs)
    return cpu / (k * MIB)


def interleave(n: int, parts: int, block: int) -> list[list[tuple[int, int]]]:
    """[0, n) cut into `block`-byte pieces dealt to `parts` readers in turn (reader k: pieces k, k + parts, ...): how
    a plan's loaders share a model file, each taking the next layer's blob from one queue."""
    if block <= 0 or parts <= 0:
        raise ValueError(f"interleave: block and parts must be > 0 (got {block}, {parts})")
    pieces = [(lo, min(lo + block, n)) for lo in range(0, n, block)]
    return [pieces[k::parts] for k in range(parts)]


def split(n: int, parts: int) -> list[tuple[int, int]]:
    """[0, n) cut into `parts` contiguous ranges."""
    cuts = [n * k // parts for k in range(parts + 1)]
    return [(cuts[k], cuts[k + 1]) for k in range(parts)]


