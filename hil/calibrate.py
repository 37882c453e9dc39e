"""Host calibration (docs/hil.md "Host profile"): measure what the cold-start components cost on THIS machine and map
the numbers onto a device profile (`planner.device.SocProfile`) plus a cost table (`planner.cost.table`).

The papers calibrate a phone's profile from component figures (EdgeFlow §3 / §4.2-4.3: flash read bandwidth, unpack
throughput per format, INT8 matmul roofline, dispatch overheads); here the same components are measured directly:
- cold read bandwidth vs request size (64 KiB ... 16 MiB) and reader threads (1, 2, 4) on a scratch file whose pages are
  evicted (`hil.pagecache.evict`, fsync + POSIX_FADV_DONTNEED) before every cold measurement -> flash_peak_gbps,
  flash_reader_gbps and flash_request_latency_s (fit of `SocProfile.reader_rate` to the 1-reader curve),
  flash_bulk_request_bytes; flash_stream_start_s = the time a cold sequential read into fresh buffers takes beyond its
  steady rate (intercept of time vs bytes over its buffers; the rate fit uses the rows less it);
  mmap_readahead_bytes = pages made resident by one page fault on an evicted file (mincore);
- warm read (page cache -> user buffer, the CPU part of a read) -> read_cpu_gbps; native memcpy 1 / 2 threads ->
  cpu_copy_gbps / dram_gbps;
- native unpack per format (weightlet R=128, mixed, kquant) x bit width 1..8 x threads -> seconds per weight;
- INT8 GEMM (native.compute) vs M x the (K, N) of SmolLM2-135M and a 1B Llama x threads; float32 elementwise ops vs
  bytes; attention vs (m, ctx, heads, head_dim); the HIL runner's per-task cost when a worker finds its next task ready
  (its worker loop over the real `Dispatcher`, charged per op) and, for the record, the Python thread hand-off through
  a threading.Condition (a worker woken by another thread's completion).
Every figure is the median of >= 3 repeats; the spread ((max - min) / median) is recorded with it; the kernels' costs
(GEMM, elementwise, attention, unpack) are their calls' expected value instead (`Stat.expected`: the mean without
preempted calls), what a cold start pays summed over many calls on a host that runs slower in bursts. The host is
shared and noisy: compare figures of one run, not runs.
"""
from __future__ import annotations

import atexit
import contextlib
import gc
import math
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

import numpy as np

import native
from hil.pagecache import PAGE, evict, resident_fraction, resident_pages

if TYPE_CHECKING:
    from hil.calibrate_runner import RunnerCost

KIB, MIB = 1 << 10, 1 << 20
LARGE_ALLOC = 16 * MIB        # B, the large allocation size of the first-touch curve
UNPACK_TOUCH_D = 2048         # row length of the unpack first-touch outputs (C x 2048 INT8: 512 rows = 1 MiB)


# ================================================ settings ===========================================================
@dataclass
class CalibrationSettings:
    """What to measure. `quick()` is the < 30 s variant the tests use (smaller files, fewer sizes and shapes)."""
    quick: bool = False
    rounds: int = 3                                                     # full passes of every measurement, merged
    #                                                                     figure by figure (hil.calibrate_merge)
    reps: int = 5                                                       # repeats per figure (median, spread)
    reps_noisy: int = 9                                                 # repeats of the first-touch and cold-read
    #                                                                     CPU figures (they move most between runs)
    scratch_bytes: int = 256 * MIB                                      # B, cold-read scratch file
    request_sizes: tuple[int, ...] = (64 * KIB, 256 * KIB, MIB, 4 * MIB, 16 * MIB)   # B per read request
    reader_threads: tuple[int, ...] = (1, 2, 4)
    copy_bytes: int = 64 * MIB                                          # B per memcpy measurement
    unpack_shape: tuple[int, int] = (2048, 8192)     # (C out channels, D weights per channel): a 1B-Llama FFN tensor
    unpack_short_shape: tuple[int, int] = (1536, 576)  # short rows (SmolLM2's FFN): the per-channel cost
    unpack_formats: tuple[str, ...] = ("weightlet", "mixed", "kquant")
    unpack_bits: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8)
    threads: tuple[int, ...] = (1, 2)                                   # threads of unpack / GEMM / elementwise
    gemm_m: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    # (K in, N out): SmolLM2-135M q/o, k/v, gate/up, down, LM head; 1B Llama q/o, k/v, gate/up, down, LM head
    gemm_kn: tuple[tuple[int, int], ...] = ((576, 576), (576, 192), (576, 1536), (1536, 576), (576, 49152),
                                           (2048, 2048), (2048, 512), (2048, 8192), (8192, 2048), (2048, 49152))
    elem_rows: tuple[int, ...] = (1, 16, 128)                           # M tokens of the elementwise ops
    elem_dims: tuple[int, ...] = (576, 2048)                            # d_model (silu_mul: 8/3 d_model)
    elem_context_reps: int = 25                                         # calls per elementwise / attention point
    # attention: (m new tokens, past tokens, heads, kv heads, head_dim)
    attn_shapes: tuple[tuple[int, int, int, int, int], ...] = (
        (1, 128, 9, 3, 64), (16, 0, 9, 3, 64), (128, 0, 9, 3, 64), (128, 128, 9, 3, 64),
        (1, 128, 32, 8, 64), (16, 0, 32, 8, 64), (128, 0, 32, 8, 64), (128, 128, 32, 8, 64))
    dispatch_tasks: int = 2000                                          # hand-offs per dispatch measurement
    runner_runs: int = 9                                                # runs of the runner on the tiny model
    overlap_blob_bytes: int = 2 * MIB                                   # tensor buffer size of the read-overlap run
    cold_set_bytes: int = 64 * MIB                                      # B cycled through by GEMM / unpack timings
    #                                                                     (> last-level cache: operands come from DRAM)
    gemm_budget_s: float = 0.1                                          # s of timed calls per GEMM point (>= reps):
    #                                                                     5 cold calls of a 16 x 576 x 1536 GEMM
    #                                                                     measured 152 us in one calibration, 230-260
    #                                                                     in loops of 50-400 calls

    def __post_init__(self) -> None:
        if not isinstance(self.rounds, int) or isinstance(self.rounds, bool) or self.rounds < 1:
            raise ValueError(f"calibrate.rounds must be an integer >= 1 (got {self.rounds!r})")
        if self.reps < 3:
            raise ValueError(f"calibrate.reps must be >= 3 (median of >= 3 repeats; got {self.reps})")
        if self.scratch_bytes < 16 * MIB:
            raise ValueError(f"calibrate.scratch_bytes must be >= 16 MiB (got {self.scratch_bytes})")

    @classmethod
    def make(cls, quick: bool, rounds: int | None = None) -> "CalibrationSettings":
        """The full or the quick settings; `rounds` None: 3 rounds for a full calibration, 1 for a quick one."""
        if not quick:
            return cls() if rounds is None else cls(rounds=rounds)
        return cls(quick=True, rounds=1 if rounds is None else rounds, reps=3, reps_noisy=3, scratch_bytes=32 * MIB,
                   request_sizes=(64 * KIB, MIB, 8 * MIB),
                   reader_threads=(1, 2),
                   copy_bytes=16 * MIB, unpack_shape=(256, 2048), unpack_short_shape=(256, 576), threads=(1,),
                   gemm_m=(1, 16, 128),
                   gemm_kn=((576, 576), (576, 1536)), elem_rows=(1, 64), elem_dims=(576,),
                   attn_shapes=((1, 64, 9, 3, 64), (64, 0, 9, 3, 64)), dispatch_tasks=300, runner_runs=3,
                   cold_set_bytes=8 * MIB,
                   gemm_budget_s=0.01)


# ================================================ statistics =========================================================
PREEMPTED_X = 3.0     # 1, a timed call over this many times the median was preempted (another thread ran)


@dataclass
class Stat:
    """Median of repeated timings (s), their spread and, from `of`, their expected value.

    `expected` is what a run pays per call on average: the mean of the calls, those over `PREEMPTED_X` x the median
    left out (preemptions: time another thread ran, which the simulator's core sharing charges on its own). On a
    shared host the median is the typical call, not the average one: this 2-vCPU VM runs ~1.45x slower in bursts
    (a 16 x 576 x 1536 GEMM timed in 6,651 windows of 20 calls over 20 s: 78 % of windows at 130-150 us, 21 % at
    170-210 us, slow bursts lasting 3 ms median, 18 ms p90; 2026-12-04), and a cold start of 0.15-1.5 s sums its
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


def split(n: int, parts: int) -> list[tuple[int, int]]:
    """[0, n) cut into `parts` contiguous ranges."""
    cuts = [n * k // parts for k in range(parts + 1)]
    return [(cuts[k], cuts[k + 1]) for k in range(parts)]


# ================================================ scratch file =======================================================
@contextlib.contextmanager
def scratch_file(directory: Path, nbytes: int) -> Iterator[Path]:
    """A file of `nbytes` random bytes under `directory`, fsynced; removed on every exit path (exceptions, Ctrl-C and
    SIGTERM while inside the block). Files left by a killed earlier run (their pid is gone) are removed first."""
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("read-*.bin"):
        pid = old.stem.split("-")[-1]
        if pid.isdigit() and not pid_alive(int(pid)):
            with contextlib.suppress(FileNotFoundError):
                old.unlink()
    path = directory / f"read-{os.getpid()}.bin"
    prev = None
    if threading.current_thread() is threading.main_thread():
        def on_term(signum, frame):                 # turn SIGTERM into an exception so `finally` runs
            raise SystemExit(128 + signum)
        prev = signal.signal(signal.SIGTERM, on_term)
    try:
        rng = np.random.default_rng(0)
        chunk = 8 * MIB
        with open(path, "wb") as f:
            left = nbytes
            while left > 0:
                n = min(chunk, left)
                f.write(rng.integers(0, 256, n, dtype=np.uint8).tobytes())
                left -= n
            f.flush()
            os.fsync(f.fileno())
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        if prev is not None:
            signal.signal(signal.SIGTERM, prev)


def pid_alive(pid: int) -> bool:
    """Whether process `pid` exists (signal 0; a process of another user counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ================================================ reads ==============================================================
def _read_range(path: Path, lo: int, hi: int, request: int) -> int:
    """pread [lo, hi) of `path` in `request`-byte requests into one reused buffer; returns bytes read."""
    buf = bytearray(request)
    mv = memoryview(buf)
    fd = os.open(path, os.O_RDONLY)
    try:
        off, got = lo, 0
        while off < hi:
            n = os.preadv(fd, [mv[:min(request, hi - off)]], off)
            if n <= 0:
                break
            off += n
            got += n
        return got
    finally:
        os.close(fd)


def read_rate(path: Path, request: int, threads: int, cold: bool) -> tuple[float, float]:
    """One measurement: `threads` readers each read a contiguous 1/threads of the file in `request`-byte preads.
    cold: the file is evicted first. Returns (aggregate B/s, resident fraction before the read)."""
    size = path.stat().st_size
    if cold:
        evict(path)
    before = resident_fraction(path)
    got = [0] * threads
    ranges = split(size, threads)

    def reader(i: int) -> Callable[[], None]:
        def run() -> None:
            got[i] = _read_range(path, *ranges[i], request)
        return run

    t0 = time.perf_counter()
    in_threads([reader(i) for i in range(threads)])
    dt = time.perf_counter() - t0
    return sum(got) / dt, before


@dataclass
class ReadCurve:
    """Cold read rates: one row per (request B, reader threads) with the median aggregate rate and its spread."""
    rows: list[dict] = field(default_factory=list)  # {request_bytes, threads, gbps (median, min, max), spread,
    #                                                   resident_before}


def measure_cold_reads(path: Path, s: CalibrationSettings) -> ReadCurve:
    curve = ReadCurve()
    for req in s.request_sizes:
        for th in s.reader_threads:
            rates, res = [], []
            for _ in range(s.reps):
                r, before = read_rate(path, req, th, cold=True)
                rates.append(r)
                res.append(before)
            st = Stat.of([1.0 / r for r in rates])            # spread of the time per byte
            curve.rows.append(dict(request_bytes=req, threads=th, gbps=float(np.median(rates)) / 1e9,
                                   gbps_min=min(rates) / 1e9, gbps_max=max(rates) / 1e9, spread=st.spread,
                                   resident_before=max(res)))
    return curve


def fit_reader(curve: ReadCurve, start_s: float = 0.0, size: int = 0) -> tuple[float, float]:
    """Fit `SocProfile.reader_rate` (request / (latency + request / reader_bw)) to the 1-reader rows: seconds per byte
    = latency x (1 / request) + 1 / reader_bw, least squares with latency >= 0. Returns (latency s, reader GB/s).
    `start_s` > 0: each row (one whole read of a `size`-byte file) less that stream start-up first
    (`flash_stream_start_s`, which the simulator adds once per stream), so the rate is the steady one."""
    one = [r for r in curve.rows if r["threads"] == 1]
    x = np.array([1.0 / r["request_bytes"] for r in one])       # 1/B
    y = np.array([1.0 / (r["gbps"] * 1e9) for r in one])        # s/B
    if start_s > 0 and size > 0:
        y = np.maximum(y - start_s / size, 0.25 * y)            # (never below a quarter of the row's time per byte)
    if len(one) >= 2 and np.ptp(x) > 0:
        lat, inv_bw = np.polyfit(x, y, 1)
        if lat < 0 or inv_bw <= 0:
            lat, inv_bw = 0.0, float(y.mean())
    else:
        lat, inv_bw = 0.0, float(y.mean())
    return float(lat), float(1.0 / inv_bw / 1e9)


def bulk_request(curve: ReadCurve, within: float = 0.95, busy_s: float = 0.0) -> int:
    """Smallest request size whose best aggregate rate (over reader counts) is within `within` of the best overall;
    with `busy_s` (s each request waits for a core while other threads occupy every core: loaders run beside the
    unpack and compute threads), the rates are those of a busy machine, request / (request / rate + busy_s)."""
    best_by_req: dict[int, float] = {}
    for r in curve.rows:
        best_by_req[r["request_bytes"]] = max(best_by_req.get(r["request_bytes"], 0.0), r["gbps"])
    if busy_s > 0:
        best_by_req = {q: q / (q / (g * 1e9) + busy_s) / 1e9 for q, g in best_by_req.items()}
    top = max(best_by_req.values())
    return min(q for q, g in best_by_req.items() if g >= within * top)


def mmap_readahead(path: Path, reps: int) -> Stat:
    """Bytes one mmap page fault brings into the page cache: evict, touch one byte in the middle of the file through
    an mmap, count resident bytes with mincore. Returned as a Stat of bytes (not seconds)."""
    import mmap

    size = path.stat().st_size
    vals = []
    for i in range(reps):
        evict(path)
        off = (size // (reps + 1) * (i + 1)) // mmap.PAGESIZE * mmap.PAGESIZE
        with open(path, "rb") as f, mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ) as m:
            _ = m[off]
            time.sleep(0.05)                                     # let the read-around I/O of the fault complete
        vals.append(resident_fraction(path) * size)
    return Stat.of(vals)


def pread_readahead(path: Path, request: int, reps: int, chunks: int = 12, pause_s: float = 0.005) -> Stat:
    """Bytes the kernel's readahead keeps in the page cache ahead of a sequential pread stream: evict, read
    `chunks` consecutive `request`-byte chunks with a pause after each (the device otherwise idle, as between a
    layer-by-layer runtime's reads), and after each of the second half count the resident bytes right after the
    stream's end (mincore). Measured 8-16 MiB ahead of 1.6 and 4 MiB chunks on this host (2026-12-01)."""
    size = path.stat().st_size
    chunks = max(2, min(chunks, size // max(1, request) - 1))
    vals = []
    buf = bytearray(request)
    fd = os.open(path, os.O_RDONLY)
    try:
        for _ in range(reps):
            evict(path)
            for k in range(chunks):
                os.preadv(fd, [buf], k * request)
                time.sleep(pause_s)
                if k >= chunks // 2:
                    pages = resident_pages(path)[(k + 1) * request // PAGE:]
                    gap = np.flatnonzero(pages == 0)
                    vals.append(float((gap[0] if gap.size else pages.size) * PAGE))
    finally:
        os.close(fd)
    return Stat.of(vals)


def _fill(fd: int, mv: memoryview, off: int, request: int, path: Path) -> None:
    """Fill `mv` from file offset `off` in preads of at most `request` bytes (OSError on a short read)."""
    n, got = len(mv), 0
    while got < n:
        k = os.preadv(fd, [mv[got:min(n, got + request)]], off + got)
        if k <= 0:
            raise OSError(f"short read at {off + got} of {path}")
        got += k


def stream_start(path: Path, request: int, blob: int = 0) -> float:
    """Seconds one cold sequential read of `path` takes beyond its steady rate, read as the runner's loads read: into
    fresh `blob`-byte buffers that stay alive (`hil.runner_state.fresh_empty`; 0 = one reused buffer) in preads of at
    most `request` bytes. The completion time of every buffer is recorded, the steady rate is the second half's
    (bytes / seconds), and the result is the total time minus size / that rate — the intercept of time vs bytes read
    (the first request waits for a synchronous read and the kernel's readahead window ramps up). Measured here
    (2026-12-03, 7 repeats): 3.2 ms (0.7-5.0) into fresh 2 MiB buffers; into one reused buffer 0-11 ms, bimodal
    (~2.5 or ~10 ms), so the fresh pattern, the runner's, is the one calibrated. >= 0."""
    from hil.runner_state import fresh_empty

    evict(path)
    size = path.stat().st_size
    chunk = blob if blob > 0 else request
    reused = None if blob > 0 else memoryview(bytearray(request))
    keep: list[np.ndarray] = []
    ends: list[tuple[int, float]] = []
    fd = os.open(path, os.O_RDONLY)
    try:
        off = 0
        t0 = time.perf_counter()
        while off < size:
            n = min(chunk, size - off)
            if reused is None:
                buf = fresh_empty(n)
                keep.append(buf)
                mv = memoryview(buf)
            else:
                mv = reused[:n]
            _fill(fd, mv, off, request, path)
            off += n
            ends.append((off, time.perf_counter() - t0))
    finally:
        os.close(fd)
    if len(ends) < 4:
        raise ValueError(f"stream_start: {path} holds fewer than 4 pieces of {chunk} B")
    (b_mid, t_mid), (b_end, t_end) = ends[len(ends) // 2 - 1], ends[-1]
    if t_end <= t_mid:
        return 0.0
    rate = (b_end - b_mid) / (t_end - t_mid)
    return max(0.0, t_end - b_end / rate)


def measure_stream_start(path: Path, request: int, blob: int, reps: int) -> Stat:
    """`stream_start` into fresh `blob`-byte buffers, one untimed read first (a fresh process's first fresh pages
    fault in slower, see `measure_read_fresh`), then `reps` times (the file evicted before each): Stat of seconds."""
    stream_start(path, request, blob)
    return Stat.of([stream_start(path, request, blob) for _ in range(max(3, reps))])


def measure_random_read(path: Path, reps: int, n: int = 64, cpu: list[Stat] | None = None) -> Stat:
    """Seconds per cold 4 KiB pread at random (sorted, distinct-page) offsets of an evicted file, 1 thread: what reading
    embedding rows of the prompt's tokens costs (no readahead helps). With `cpu`, the reading thread's CPU seconds per
    read (`time.thread_time`: the syscall, page allocation, I/O submission and completion, the copy) are appended to
    it as a Stat."""
    size = path.stat().st_size
    rng = np.random.default_rng(3)
    buf = bytearray(4096)
    vals, cpus = [], []
    fd = os.open(path, os.O_RDONLY)
    try:
        for _ in range(reps):
            evict(path)
            offs = np.sort(rng.choice(size // 4096 - 1, size=n, replace=False)) * 4096
            t0, c0 = time.perf_counter(), time.thread_time()
            for o in offs:
                os.preadv(fd, [buf], int(o))
            vals.append((time.perf_counter() - t0) / n)
            cpus.append((time.thread_time() - c0) / n)
    finally:
        os.close(fd)
    if cpu is not None:
        cpu.append(Stat.of(cpus))
    return Stat.of(vals)


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


@dataclass
class BusyReadCost:
    per_request: Stat     # s added to each sequential read request while other threads occupy every core
    other_cpu: Stat       # core-s per B the busy threads lose beyond the reader's own CPU (I/O completion work)


def measure_read_busy(path: Path, s: CalibrationSettings, request: int) -> BusyReadCost:
    """Cold 1-thread reads of `path` in `request`-byte preads into a reused buffer, alone and with one CPU-bound
    thread per core, measured alternately. (busy - alone) / requests: the reader needs little CPU, but each time it
    blocks on the disk it waits for a time slice before it can issue its next request (and trigger the next
    readahead). The busy threads' lost work (their rate just before vs during the read, in core-seconds) minus the
    reader's own CPU time: interrupt and block-completion work, charged to whichever thread runs."""
    size = path.stat().st_size
    n_req = -(-size // request)
    cores = len(os.sched_getaffinity(0))
    lat, other = [], []
    for _ in range(max(3, s.reps_noisy)):
        alone = cold_read(path, request, 4 * MIB, fresh=False)[0]
        with busy_cores(cores) as counts:
            c0, t0 = sum(counts), time.perf_counter()
            time.sleep(0.1)
            r0 = (sum(counts) - c0) / (time.perf_counter() - t0)          # calls / s with the cores to themselves
            c1 = sum(counts)
            busy, reader_cpu = cold_read(path, request, 4 * MIB, fresh=False)
            r1 = (sum(counts) - c1) / busy
        lat.append(max(busy - alone, 0.0) / n_req)
        lost = max(r0 - r1, 0.0) / r0 * cores * busy if r0 > 0 else 0.0
        other.append(max(lost - reader_cpu, 0.0) / size)
    return BusyReadCost(Stat.of(lat), Stat.of(other))


def measure_random_read_busy(path: Path, reps: int, request: int, n: int = 64) -> Stat:
    """Seconds per cold 4 KiB random pread (second descriptor, POSIX_FADV_RANDOM) while another thread streams the
    same evicted file sequentially in `request`-byte preads: the embedding rows' reads during the layer loads, queued
    behind the stream's readahead."""
    import threading

    size = path.stat().st_size
    rng = np.random.default_rng(4)
    vals = []
    for _ in range(reps):
        evict(path)
        stop = threading.Event()

        def stream() -> None:
            fd = os.open(path, os.O_RDONLY)
            buf = bytearray(request)
            try:
                off = 0
                while not stop.is_set() and off < size:
                    off += max(1, os.preadv(fd, [buf], off))
            finally:
                os.close(fd)

        th = threading.Thread(target=stream, daemon=True)
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        buf = bytearray(4096)
        try:
            th.start()
            time.sleep(0.002)                                   # the stream is under way
            offs = np.sort(rng.choice(size // 4096 - 1, size=n, replace=False)) * 4096
            t0 = time.perf_counter()
            for o in offs:
                os.preadv(fd, [buf], int(o))
            vals.append((time.perf_counter() - t0) / n)
        finally:
            stop.set()
            th.join()
            os.close(fd)
    return Stat.of(vals)


def measure_warm_read(path: Path, s: CalibrationSettings) -> dict[int, Stat]:
    """Page cache -> user buffer (the CPU cost of a read()), 1 MiB preads over the whole resident file, per thread
    count: Stat of seconds per byte (aggregate)."""
    size = path.stat().st_size
    _read_range(path, 0, size, 4 * MIB)                          # make it resident
    out = {}
    for th in sorted(set(s.threads) | {1}):
        ranges = split(size, th)
        st = timed(lambda: in_threads([lambda r=r: _read_range(path, r[0], r[1], MIB) for r in ranges]), s.reps)
        out[th] = Stat(st.median / size, st.spread, st.n)
    return out


# ================================================ copy ===============================================================
def cold_read(path: Path, request: int, blob: int, fresh: bool, threads: int = 1) -> tuple[float, float]:
    """(wall s, thread CPU s summed over the readers) of one cold sequential read of `path` in `request`-byte preads:
    into fresh `blob`-byte buffers that stay alive (the runner's loads: `hil.runner_state.fresh_empty`, one buffer per
    tensor) or into one reused, already touched buffer per reader. `threads` > 1: each reads its own contiguous part
    of the file at the same time (a plan's loaders)."""
    from hil.runner_state import fresh_empty

    evict(path)
    size = path.stat().st_size
    cpu = [0.0] * threads

    def read_part(i: int, lo: int, hi: int) -> None:
        keep = []
        reused = fresh_empty(blob)
        reused[:] = 1
        fd = os.open(path, os.O_RDONLY)
        try:
            c0 = time.thread_time()
            off = lo
            while off < hi:
                n = min(blob, hi - off)
                buf = fresh_empty(n) if fresh else reused[:n]
                mv = memoryview(buf)
                _fill(fd, mv, off, request, path)
                del mv
                if fresh:
                    keep.append(buf)
                off += n
            cpu[i] = time.thread_time() - c0
        finally:
            os.close(fd)

    t0 = time.perf_counter()
    in_threads([lambda i=i, a=a, b=b: read_part(i, a, b) for i, (a, b) in enumerate(split(size, threads))])
    wall = time.perf_counter() - t0
    return wall, sum(cpu)


@dataclass
class ColdReadCost:
    """Cold sequential reads (bulk requests) into fresh kept buffers and into one reused buffer, measured
    alternately: wall and thread CPU seconds per byte, by 1 thread and (`*_2`) by 2 threads at once (each reading
    half the file; CPU summed over both)."""
    fresh_wall: Stat
    reused_wall: Stat
    fresh_cpu: Stat
    reused_cpu: Stat
    fresh_wall_2: Stat | None = None
    reused_wall_2: Stat | None = None
    fresh_cpu_2: Stat | None = None


def measure_read_fresh(path: Path, s: CalibrationSettings, request: int) -> ColdReadCost:
    """The CPU side of a cold read (reused buffer: the syscall's page-cache work and copy), the extra CPU of filling
    fresh memory (the kernel faults the pages in inside its copy) and, from the wall times, how much of the CPU side
    hides under the device transfer (`read_cpu_overlap`, hil.host) — by one reader and by two at once
    (`read_cpu_overlap_multi`: measured 0.9 and ~0.35 here, two fresh readers together 1.7-1.9 GB/s where reused
    buffers give 2.6)."""
    size = path.stat().st_size
    rows: dict[str, list[float]] = {k: [] for k in ("fw", "rw", "fc", "rc", "fw2", "rw2", "fc2")}
    # one untimed repeat first, as a validate session's warm-up run: a fresh process's first reads into fresh
    # memory fault in several times slower on this VM (extra CPU over the reused-buffer read: 0.46-1.14 ns/B in
    # the first one to three 256 MiB reads of a process, 0.26-0.37 after; 2026-12-01), which the measured runs of
    # a session, reusing the memory of the run before, do not see
    for th in (1, 2):
        cold_read(path, request, s.overlap_blob_bytes, fresh=True, threads=th)
    for _ in range(max(3, s.reps_noisy)):
        for th, sfx in ((1, ""), (2, "2")):
            w, c = cold_read(path, request, s.overlap_blob_bytes, fresh=True, threads=th)
            rows["fw" + sfx].append(w / size)
            rows["fc" + sfx].append(c / size)
            w, c = cold_read(path, request, s.overlap_blob_bytes, fresh=False, threads=th)
            rows["rw" + sfx].append(w / size)
            if th == 1:
                rows["rc"].append(c / size)
    return ColdReadCost(*(Stat.of(rows[k]) for k in ("fw", "rw", "fc", "rc", "fw2", "rw2", "fc2")))


def measure_copy(s: CalibrationSettings) -> dict[int, Stat]:
    """native.memcpy of `copy_bytes` (beyond the caches), split over 1 or 2 threads: Stat of seconds per byte."""
    src = np.random.default_rng(1).integers(0, 256, s.copy_bytes, dtype=np.uint8)
    dst = np.empty_like(src)
    out = {}
    for th in sorted(set(s.threads) | {1, 2}):
        parts = split(s.copy_bytes, th)
        st = timed(lambda: in_threads([lambda a=a, b=b: native.memcpy(dst[a:b], src[a:b]) for a, b in parts]),
                   s.reps)
        out[th] = Stat(st.median / s.copy_bytes, st.spread, st.n)
    return out


def _read_and_evict(path: Path) -> None:
    """Read `path` into the page cache, then evict it: its pages go back to the free lists, as the runner's model file
    does right before t0 (the memory a cold start then allocates is what the kernel hands out next)."""
    with open(path, "rb") as fh:
        while fh.read(16 * MIB):
            pass
    evict(path)


def _touch_excess(s: CalibrationSettings, nbytes: int, k: int, write: Callable[[np.ndarray], object],
                  clock: Callable[[], float], evicted: Path | None) -> list[float]:
    """Per repeat (`s.reps_noisy`, at least 3): seconds per byte of `write` into `k` fresh `nbytes`-byte buffers
    (`hil.runner_state.fresh_empty`) minus the same writes again, on `clock`. One untimed repeat first, and each
    repeat's buffers are freed before the next, as a validate session's runs go (a warm-up run, then cold runs that
    each allocate their tensors afresh and free them at the end: the memory a run faults in is what the run before
    gave back). Keeping every repeat's buffers instead measured the first touch of memory no run had used: on the
    Firecracker VM of 2026-12-04 0.3-0.5 GB/s with transparent huge pages (the guest assembling new 2 MiB blocks) where
    the runs' memory faulted in at 6-15 GB/s. With `evicted`, that file is read and evicted before every repeat (the
    runner's state: its model file was just evicted)."""
    from hil.runner_state import fresh_empty

    vals = []
    for rep in range(max(3, s.reps_noisy) + 1):
        if evicted is not None:
            _read_and_evict(evicted)
        bufs = [fresh_empty(nbytes) for _ in range(k)]
        t0 = clock()
        for d in bufs:
            write(d)
        t1 = clock()
        for d in bufs:
            write(d)
        t2 = clock()
        if rep:
            vals.append(max((t1 - t0) - (t2 - t1), 1e-9) / (nbytes * k))
        del bufs, d
        gc.collect()                              # the mappings go back to the kernel before the next repeat
    return vals


def measure_first_touch(s: CalibrationSettings, n: int = MIB, total: int = 64 * MIB,
                        evicted: Path | None = None) -> Stat:
    """Seconds per byte of touching freshly allocated memory for the first time (page faults + zeroing), the way the
    runner allocates its tensors (hil.runner_state.fresh_empty, one buffer per tensor, all kept alive): a copy into
    `total` bytes of fresh `n`-byte buffers minus the same copies again (`_touch_excess`, wall time). The size
    matters (measured here: 16 MiB buffers fault for ~1/3 of the per-byte cost of 1 MiB ones). `evicted`: see
    `_touch_excess`."""
    src = np.random.default_rng(2).integers(0, 256, n, dtype=np.uint8)
    vals = _touch_excess(s, n, max(1, total // n), lambda d: native.memcpy(d, src), time.perf_counter, evicted)
    med = float(np.median(vals))
    return Stat(med, float((max(vals) - min(vals)) / med), len(vals))


def measure_unpack_touch(s: CalibrationSettings, C: int, D: int, total: int = 64 * MIB,
                         evicted: Path | None = None) -> Stat:
    """Thread CPU seconds per byte of an unpack kernel's first touch of its fresh (C, D) INT8 output, the runner's
    unpack (hil.runner_state: weightlet at 5 bits into a `fresh_empty` output, all kept alive): unpacks of `total`
    bytes of outputs into fresh buffers minus the same unpacks again (`_touch_excess`). The writer matters: the same
    fresh 16 MiB buffers measured 0.20 ns/B written by the unpack kernel and 0.30 by memcpy (`measure_first_touch`),
    1 MiB ones 0.22 and 0.27 (2026-12-03), so the unpack's first touch is measured through the unpack kernel."""
    from quant.pack import pack_bits3
    from quant.pack.formats import get_format

    f = get_format("weightlet")
    bits = np.full(C, 5, dtype=np.int64)
    payload = np.ascontiguousarray(f.pack(_codes(5, (C, D), np.random.default_rng(4)), bits, 128, "calibration"))
    b3 = pack_bits3(bits)

    def unpack(buf: np.ndarray) -> None:
        f.unpack_native(payload, b3, C, D, 128, out=buf.view(np.int8).reshape(C, D))

    unpack(np.ones(C * D, dtype=np.uint8))                                          # code paths warm
    return Stat.of(_touch_excess(s, C * D, max(1, total // (C * D)), unpack, time.thread_time, evicted))


# ================================================ unpack =============================================================
def _codes(bits: int, shape: tuple[int, int], rng: np.random.Generator) -> np.ndarray:
    lo = -(1 << (bits - 1))
    return rng.integers(lo, -lo, size=shape).astype(np.int8)


def _unpack_seconds(s: CalibrationSettings, fmt: str, b: int, C: int, D: int, rng: np.random.Generator
                    ) -> dict[int, Stat]:
    """threads -> seconds of one unpack of a (C, D) tensor with every channel at `b` bits, inputs and outputs cycled
    through `cold_set_bytes` of buffers (DRAM-resident, as a cold start's unpack; outputs touched before)."""
    from quant.pack import pack_bits3
    from quant.pack.formats import get_format

    f = get_format(fmt)
    bits = np.full(C, b, dtype=np.int64)
    payload = np.ascontiguousarray(f.pack(_codes(b, (C, D), rng), bits, 128, "calibration"))
    payloads = [payload] + [payload.copy() for _ in range(max(1, -(-s.cold_set_bytes // payload.nbytes)) - 1)]
    # np.full writes every page: np.zeros of a large array is calloc'ed, untouched memory, and each call on a fresh
    # output then paid first touch (a 1536 x 576 unpack measured 441 us instead of 82)
    outs = [np.full((C, D), 1, dtype=np.int8) for _ in range(max(1, -(-s.cold_set_bytes // (C * D))))]
    b3 = pack_bits3(bits)
    out: dict[int, Stat] = {}
    for th in s.threads:                                     # channel ranges split over threads
        turn = [0]

        def call(th=th) -> None:
            turn[0] += 1
            src, dst = payloads[turn[0] % len(payloads)], outs[turn[0] % len(outs)]
            in_threads([lambda a=a, z=z: f.unpack_native(src, b3, C, D, 128, out=dst, c0=a, c1=z)
                        for a, z in split(C, th)])
        out[th] = timed(call, s.reps, budget_s=s.gemm_budget_s / 2)
    return out


def measure_unpack(s: CalibrationSettings) -> list[dict]:
    """Seconds per weight and per channel of each native unpack kernel with every channel at one bit width: rows
    {fmt, bits, threads, s_per_weight, s_per_channel, spread} (weightlet with R = 128 weights per group), from two
    shapes, long rows (`unpack_shape`) and short ones (`unpack_short_shape`): per channel, t / C = D w + c (a short
    row pays its fixed per-channel work over fewer weights: measured 1.7-3x the per-weight time of 8192-weight rows
    at 576). First touch of the outputs is `mem_fault_gbps`, charged apart."""
    (C1, D1), (C2, D2) = s.unpack_shape, s.unpack_short_shape
    rng = np.random.default_rng(2)
    rows = []
    for fmt in s.unpack_formats:
        for b in s.unpack_bits:
            long_, short = _unpack_seconds(s, fmt, b, C1, D1, rng), _unpack_seconds(s, fmt, b, C2, D2, rng)
            for th in s.threads:
                p1, p2 = long_[th].expected / C1, short[th].expected / C2        # s per channel
                w = (p1 - p2) / (D1 - D2) if D1 != D2 else p1 / D1
                c = p2 - D2 * w
                if w <= 0 or c < 0:                                              # noise: per weight only
                    w, c = long_[th].expected / (C1 * D1), 0.0
                rows.append(dict(fmt=fmt, bits=b, threads=th, s_per_weight=w, s_per_channel=c,
                                 spread=max(long_[th].spread, short[th].spread)))
    return rows


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
        x = rng.integers(-127, 128, size=(M, K), dtype=np.int8)
        ws = weights or [rng.integers(-127, 128, size=(N, K), dtype=np.int8)]
        out = np.empty((M, N), dtype=np.int32)
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
        x = rng.standard_normal((M, d)).astype(np.float32)
        y = rng.standard_normal((M, d)).astype(np.float32)
        g = rng.standard_normal(d).astype(np.float32)
        o = np.empty_like(x)
        dff = (8 * d // 3 + 63) // 64 * 64
        a = rng.standard_normal((M, dff)).astype(np.float32)
        b = rng.standard_normal((M, dff)).astype(np.float32)
        of = np.empty_like(a)
        i32 = rng.integers(-1 << 20, 1 << 20, size=(M, d), dtype=np.int32)
        i8 = np.empty((M, d), dtype=np.int8)
        scale = np.full(d, 1e-3, dtype=np.float32)
        hd = 64
        H = max(1, d // hd)
        q = rng.standard_normal((M, H, hd)).astype(np.float32)
        cos = np.cos(rng.standard_normal((M, hd // 2))).astype(np.float32)
        sin = np.sin(rng.standard_normal((M, hd // 2))).astype(np.float32)
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
        q = rng.standard_normal((m, H, hd)).astype(np.float32)
        k = rng.standard_normal((cap, KV, hd)).astype(np.float32)
        v = rng.standard_normal((cap, KV, hd)).astype(np.float32)
        out = np.empty((m, H * hd), dtype=np.float32)
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
        base = rng.integers(-127, 128, size=(N, K), dtype=np.int8)
        copies = [base] + [base.copy() for _ in range(max(1, -(-s.cold_set_bytes // base.nbytes)) - 1)]
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
    base = rng.integers(-127, 128, size=(1536, 576), dtype=np.int8)
    copies = [base] + [base.copy() for _ in range(max(1, -(-s.cold_set_bytes // base.nbytes)) - 1)]
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
                with cond:
                    st["task"] += 1
                    sent[0] = time.perf_counter()
                    cond.notify_all()
                work()                                      # the waker keeps computing
                with cond:
                    while st["done"] != st["task"]:
                        cond.wait()
        finally:
            os.sched_setaffinity(0, mask)
            with cond:
                st["stop"] = True
                cond.notify_all()
            th.join()
        vals.append(float(np.mean(delays)))
    return Stat.of(vals)


# ================================================ everything ========================================================
@dataclass
class Measurements:
    """Raw results of one calibration run (every number measured here)."""
    settings: CalibrationSettings
    reads: ReadCurve
    reader_latency_s: float
    reader_gbps: float
    bulk_request_bytes: int
    readahead: Stat                       # B
    warm_read: dict[int, Stat]            # threads -> s per B
    copy: dict[int, Stat]                 # threads -> s per B
    unpack: list[dict]
    kernels: str                          # which compute kernels were measured
    gemm: list[dict]
    elementwise: list[dict]
    attention: list[dict]
    dispatch: Stat                        # s per hand-off round trip (post a task to a waiting thread and back)
    dispatch_busy: Stat                   # the same while CPU-bound threads occupy every core
    dispatch_worker_cpu: Stat             # s of the worker thread's CPU per hand-off (idle machine)
    runner: RunnerCost                    # s per op / loaded tensor / unpacked tensor of the runner itself
    corun: dict[str, Stat]                # class -> CPU time with another core busy / alone (hil.calibrate_corun)
    first_touch: Stat                     # s per B of first touch of fresh memory (1 MiB buffers)
    first_touch_large: Stat               # s per B of first touch of fresh 16 MiB buffers
    cold_read: ColdReadCost               # s per B, cold 1-thread reads into fresh / reused buffers, wall and CPU
    read_busy: BusyReadCost               # per request while other threads occupy every core; their lost CPU per B
    random_read: Stat                     # s per cold random 4 KiB read
    random_read_busy: Stat                # s per cold random 4 KiB read while a sequential stream runs
    wall_s: dict[str, float]              # s per measurement group
    loadavg: tuple[float, float, float]   # 1/5/15-min load average at the start (other work on the shared host)
    host_probe: dict[str, float] = field(default_factory=dict)   # hil.drift.probe() at the start (s per probe)
    pread_readahead: Stat | None = None   # B resident ahead of a paused sequential pread stream
    pool_wake: Stat | None = None         # s a 2-thread GEMM takes longer when its helper sleeps (measure_pool_wake)
    stream_start: Stat | None = None      # s a cold sequential read takes beyond its steady rate (stream_start)
    unpack_touch: Stat | None = None      # s per B of an unpack kernel's first touch of fresh 1 MiB outputs
    unpack_touch_large: Stat | None = None  # the same, fresh 16 MiB outputs
    wake_idle_core: Stat | None = None    # s until a thread woken on an idle core runs while its waker computes
    random_read_cpu: Stat | None = None   # s of the reading thread's CPU per cold random 4 KiB read
    huge_pages: bool = False              # fresh memory asked for transparent huge pages (hil.runner_state.huge_pages)


def measure_all(scratch_dir: Path, s: CalibrationSettings, log: Callable[[str], None] = lambda m: None
                ) -> Measurements:
    """Run every measurement; the scratch file lives under `scratch_dir` only while the read measurements run."""
    wall: dict[str, float] = {}
    load = os.getloadavg()

    def step(name: str, fn: Callable[[], object]):
        t0 = time.perf_counter()
        r = fn()
        wall[name] = time.perf_counter() - t0
        log(f"calibrate: {name} {wall[name]:.1f} s")
        return r

    from hil.drift import probe

    # first, in a fresh process state, as experiments.validate probes before its runs (after the calibration's
    # other steps the same GEMM probe measured 191 us where a fresh process measured 131)
    host_probe = step("host_probe", lambda: probe())
    with scratch_file(scratch_dir, s.scratch_bytes) as path:
        reads = step("cold_read", lambda: measure_cold_reads(path, s))
        ra = step("mmap_readahead", lambda: mmap_readahead(path, s.reps))
        warm = step("warm_read", lambda: measure_warm_read(path, s))
        rnd_cpu: list[Stat] = []
        rnd = step("random_read", lambda: measure_random_read(path, s.reps, cpu=rnd_cpu))
        rbusy = step("read_busy", lambda: measure_read_busy(path, s, bulk_request(reads)))
        req = bulk_request(reads, busy_s=rbusy.per_request.median)        # the loaders' request size
        rnd_busy = step("random_read_busy", lambda: measure_random_read_busy(path, s.reps, req))
        pread_ra = step("pread_readahead", lambda: pread_readahead(path, req, s.reps))
        cold = step("read_fresh", lambda: measure_read_fresh(path, s, req))
        sstart = step("stream_start", lambda: measure_stream_start(path, req, s.overlap_blob_bytes, s.reps_noisy))
        touch = step("first_touch", lambda: measure_first_touch(s, MIB, evicted=path))
        touch_large = step("first_touch_large", lambda: measure_first_touch(s, LARGE_ALLOC, evicted=path))
        utouch = step("unpack_touch", lambda: measure_unpack_touch(s, MIB // UNPACK_TOUCH_D, UNPACK_TOUCH_D,
                                                                   evicted=path))
        utouch_large = step("unpack_touch_large", lambda: measure_unpack_touch(
            s, LARGE_ALLOC // UNPACK_TOUCH_D, UNPACK_TOUCH_D, evicted=path))
        from hil.calibrate_corun import measure_corun  # these run hil.runner (not needed by this module)
        from hil.calibrate_runner import TinyRun, measure_runner_cost

        with TinyRun(scratch_dir) as tiny:
            corun = step("corun", lambda: measure_corun(s, path, tiny.cycle))
    lat, rbw = fit_reader(reads, sstart.median, s.scratch_bytes)
    copy = step("copy", lambda: measure_copy(s))
    unpack = step("unpack", lambda: measure_unpack(s))
    k = Kernels()
    gemm = step("gemm", lambda: measure_gemm(k, s))
    pool_wake = step("pool_wake", lambda: measure_pool_wake(k, s))
    elem = step("elementwise", lambda: measure_elementwise(k, s))
    attn = step("attention", lambda: measure_attention(k, s))
    wake_cpu: list[float] = []
    disp = step("dispatch", lambda: measure_dispatch(s, wake_cpu))
    wake = Stat(wake_cpu[0] if wake_cpu else 0.0, disp.spread, disp.n)   # one mean over every hand-off of the run
    with TinyRun(scratch_dir) as tiny:     # last: away from the scratch file's writeback and the page-cache churn
        runner = step("runner", lambda: measure_runner_cost(tiny, s.runner_runs, s.reps, cold.fresh_cpu.median,
                                                            utouch.median))
    disp_busy = step("dispatch_busy", lambda: measure_dispatch_busy(s))
    wake_idle = step("wake_idle_core", lambda: measure_wake_idle_core(k, s))
    from hil.runner_state import huge_pages_enabled

    return Measurements(s, reads, lat, rbw, req, ra, warm, copy, unpack, k.label, gemm, elem, attn,
                        disp, disp_busy, wake, runner, corun, touch, touch_large, cold, rbusy, rnd, rnd_busy, wall,
                        load, host_probe, pread_ra, pool_wake, sstart, utouch, utouch_large, wake_idle,
                        rnd_cpu[0] if rnd_cpu else None, huge_pages_enabled())
