"""Host calibration (docs/hil.md "Host profile"): measure what the cold-start components cost on THIS machine;
`hil.host` maps the numbers onto a device profile (`planner.device.SocProfile`), the host's runtime model
(`planner.host_runtime.HostRuntime`) and a cost table (`planner.cost.table`).

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

Modules: this one holds the settings, memory (copy, first touch), unpack and `measure_all`; the storage
measurements are in `hil.calibrate_reads`, the compute kernels and dispatch in `hil.calibrate_compute`, the timing
statistics in `hil.calibrate_stats`, co-run slowdowns in `hil.calibrate_corun`, the runner's own costs in
`hil.calibrate_runner`, the merge of rounds in `hil.calibrate_merge`.
"""
from __future__ import annotations

import gc
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

import native
from hil.calibrate_compute import (
    Kernels,
    measure_attention,
    measure_dispatch,
    measure_dispatch_busy,
    measure_elementwise,
    measure_gemm,
    measure_pool_wake,
    measure_wake_idle_core,
    measure_wake_pack,
)
from hil.calibrate_reads import (
    BusyReadCost,
    ColdReadCost,
    ReadCurve,
    bulk_request,
    fit_reader,
    measure_cold_reads,
    measure_random_read,
    measure_random_read_busy,
    measure_read_busy,
    measure_read_fresh,
    measure_stream_start,
    measure_warm_read,
    mmap_readahead,
    pread_readahead,
    scratch_file,
)
from hil.calibrate_settings import CalibrationSettings
from hil.calibrate_stats import MIB, Stat, in_threads, split, timed
from hil.pagecache import evict

if TYPE_CHECKING:
    from hil.calibrate_runner import RunnerCost

LARGE_ALLOC = 16 * MIB        # B, the large allocation size of the first-touch curve
UNPACK_TOUCH_D = 2048         # row length of the unpack first-touch outputs (C x 2048 INT8: 512 rows = 1 MiB)


# ================================================ copy ===============================================================
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
    repeat's buffers are freed before the next, as validate's runs go (a warm-up run, then cold runs that each
    allocate their tensors afresh and free them at the end: the memory a run faults in is what the run before gave
    back). Keeping every repeat's buffers instead measures the first touch of memory no run has used, which on a VM
    with transparent huge pages can be an order of magnitude slower than what the runs see (measured on the host:
    docs/hil.md "Host memory"). With `evicted`, that file is read and evicted before every repeat (the
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
    1 MiB ones 0.22 and 0.27 (measured on the host, docs/hil.md "Host profile"), so the unpack's first touch is
    measured through the unpack kernel."""
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
    host_probe: dict[str, float] = field(default_factory=dict)   # s per probe, hil.diagnostics.drift.probe() first
    pread_readahead: Stat | None = None   # B resident ahead of a paused sequential pread stream
    pool_wake: Stat | None = None         # s a 2-thread GEMM takes longer when its helper sleeps (measure_pool_wake)
    stream_start: Stat | None = None      # s a cold sequential read takes beyond its steady rate (stream_start)
    unpack_touch: Stat | None = None      # s per B of an unpack kernel's first touch of fresh 1 MiB outputs
    unpack_touch_large: Stat | None = None  # the same, fresh 16 MiB outputs
    wake_idle_core: Stat | None = None    # s until a thread woken on an idle core runs while its waker computes
    random_read_cpu: Stat | None = None   # s of the reading thread's CPU per cold random 4 KiB read
    huge_pages: bool = False              # fresh memory asked for transparent huge pages (hil.runner_state.huge_pages)
    wake_pack: list[dict] | None = None   # where a woken thread runs, by its core's idle time (measure_wake_pack)


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

    from hil.diagnostics.drift import READ_PROBE_BYTES, probe, read_probe

    # first, in a fresh process state, as experiments.validate probes before its runs (after the calibration's
    # other steps the same GEMM probe measured 191 us where a fresh process measured 131)
    host_probe = step("host_probe", lambda: probe())
    # the read probe as validate takes it: a READ_PROBE_BYTES scratch file of its own, just written (the first 32
    # MiB of the 256 MiB file below read 15-25 % slower right after its write: 2.31-2.81 against 3.15-3.30 GB/s)
    with scratch_file(scratch_dir, READ_PROBE_BYTES) as path:        # (removed before the next one is written)
        host_probe.update(step("read_probe", lambda: read_probe(path)))
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
    wake_pack = step("wake_pack", lambda: measure_wake_pack(k, s))
    from hil.runner_state import huge_pages_enabled

    return Measurements(s, reads, lat, rbw, req, ra, warm, copy, unpack, k.label, gemm, elem, attn,
                        disp, disp_busy, wake, runner, corun, touch, touch_large, cold, rbusy, rnd, rnd_busy, wall,
                        load, host_probe, pread_ra, pool_wake, sstart, utouch, utouch_large, wake_idle,
                        rnd_cpu[0] if rnd_cpu else None, huge_pages_enabled(), wake_pack)

