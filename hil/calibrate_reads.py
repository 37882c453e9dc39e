"""Storage measurements of the host calibration (docs/hil.md "Host profile"): the scratch file, cold reads vs request
size and reader threads (page cache evicted before each), the reader fit, readahead, the stream start, random reads
(alone, behind a stream, on busy cores), warm reads, and cold reads into fresh vs reused buffers (the CPU side of a
read and how much of it hides under the transfer)."""
from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

import numpy as np

from hil.calibrate_compute import busy_cores
from hil.calibrate_stats import MIB, Stat, in_threads, interleave, split, timed
from hil.pagecache import PAGE, evict, resident_fraction, resident_pages

if TYPE_CHECKING:
    from hil.calibrate_settings import CalibrationSettings


# ================================================ scratch file =======================================================
@contextlib.contextmanager
def scratch_file(directory: Path, nbytes: int) -> Iterator[Path]:
    """A file of `nbytes` random bytes under `directory`, fsynced; removed on every exit path (exceptions, Ctrl-C and
    SIGTERM while inside the block). Files left by a killed earlier run (their pid is gone) are removed first."""
    directory.mkdir(parents=True, exist_ok=True)
    remove_stale_scratch(directory)
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


def remove_stale_scratch(directory: Path, dry_run: bool = False) -> list[Path]:
    """Remove the scratch files (`read-<pid>.bin`) of processes that are gone (a killed calibration or validate);
    the paths removed (with `dry_run`: that would be)."""
    gone = [p for p in sorted(directory.glob("read-*.bin"))
            if (pid := p.stem.split("-")[-1]).isdigit() and not pid_alive(int(pid))] if directory.is_dir() else []
    if not dry_run:
        for p in gone:
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
    return gone


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
    return _read_pieces(path, [(lo, hi)], request)


def _read_pieces(path: Path, pieces: list[tuple[int, int]], request: int) -> int:
    """pread each [lo, hi) of `pieces` in turn through one file descriptor, in `request`-byte requests into one
    reused buffer; returns bytes read. One descriptor for all of a reader's pieces, as the runner's loader threads
    keep one each (`hil.runner`): the kernel keeps its readahead state per open file, so a descriptor opened per
    piece starts every piece's readahead afresh — 2.19-2.30 GB/s against 2.58-2.62 through one descriptor (cold,
    4 MiB pieces and requests, 96-256 MiB files, six alternations; measured on an AMD EPYC VM, docs/hil.md)."""
    buf = bytearray(request)
    mv = memoryview(buf)
    fd = os.open(path, os.O_RDONLY)
    got = 0
    try:
        for lo, hi in pieces:
            off = lo
            while off < hi:
                n = os.preadv(fd, [mv[:min(request, hi - off)]], off)
                if n <= 0:
                    return got
                off += n
                got += n
        return got
    finally:
        os.close(fd)


READ_BLOCK = 4 * MIB    # B per piece several cold readers take in turn (a SmolLM2 layer's blob is 2-4 MiB)


def read_rate(path: Path, request: int, threads: int, cold: bool, block: int = READ_BLOCK) -> tuple[float, float]:
    """One measurement: `threads` readers take `block`-byte pieces of the file in turn (`interleave`, as a plan's
    loaders take its layers), each read in `request`-byte preads through the reader's one descriptor (`_read_pieces`:
    as the runner's loaders read). cold: the file is evicted first. Returns (aggregate
    B/s, resident fraction before the read).

    Why in turn, not a contiguous 1/threads each: two loaders taking alternate layers read slower than one
    (measured, SmolLM2 5-bit EdgeFlow loads alone through the runner on a Zen 5 VM: 38.8-46.4 ms with two loaders,
    40.1-44.0 with one; the 1B model's 0.71 GB 257-327 and 237-289 ms), where two readers of the file's two halves
    gained (2.71-3.20 GB/s against 1.82-2.96 taking 3 MiB pieces in turn, 96 MiB file, eight alternations): the
    profile measured the halves, and the simulator predicted two loaders 10 % faster than one."""
    size = path.stat().st_size
    if cold:
        evict(path)
    before = resident_fraction(path)
    got = [0] * threads
    parts = interleave(size, threads, block)

    def reader(i: int) -> Callable[[], None]:
        def run() -> None:
            got[i] = _read_pieces(path, parts[i], request)     # one descriptor per reader (_read_pieces)
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
    stream's end (mincore). Measured 8-16 MiB ahead of 1.6 and 4 MiB chunks on the host (docs/hil.md "Loads")."""
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
    (the first request waits for a synchronous read and the kernel's readahead window ramps up). Measured on the
    host (7 repeats; docs/hil.md "Loads"): 3.2 ms (0.7-5.0) into fresh 2 MiB buffers; into one reused buffer
    0-11 ms, bimodal (~2.5 or ~10 ms), so the fresh pattern, the runner's, is the one calibrated. >= 0."""
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


def cold_read(path: Path, request: int, blob: int, fresh: bool, threads: int = 1) -> tuple[float, float]:
    """(wall s, thread CPU s summed over the readers) of one cold sequential read of `path` in `request`-byte preads:
    into fresh `blob`-byte buffers that stay alive (the runner's loads: `hil.runner_state.fresh_empty`, one buffer per
    tensor) or into one reused, already touched buffer per reader. `threads` > 1: the readers take the file's
    `blob`-byte pieces in turn at the same time (`interleave`: a plan's loaders taking its layers; `read_rate`'s doc
    says why)."""
    from hil.runner_state import fresh_empty

    evict(path)
    size = path.stat().st_size
    cpu = [0.0] * threads

    def read_part(i: int, pieces: list[tuple[int, int]]) -> None:
        keep = []
        reused = fresh_empty(blob)
        reused[:] = 1
        fd = os.open(path, os.O_RDONLY)
        try:
            c0 = time.thread_time()
            for off, hi in pieces:
                n = hi - off
                buf = fresh_empty(n) if fresh else reused[:n]
                mv = memoryview(buf)
                _fill(fd, mv, off, request, path)
                del mv
                if fresh:
                    keep.append(buf)
            cpu[i] = time.thread_time() - c0
        finally:
            os.close(fd)

    t0 = time.perf_counter()       # the blobs dealt in turn, as the simulated twin's loaders take them (hil.host)
    in_threads([lambda i=i, p=p: read_part(i, p) for i, p in enumerate(interleave(size, threads, blob))])
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
    # one untimed repeat first, as validate's warm-up run: a fresh process's first reads into fresh memory fault in
    # several times slower on the host VM (measured, extra CPU over the reused-buffer read: 0.46-1.14 ns/B in the
    # first one to three 256 MiB reads of a process, 0.26-0.37 after), which validate's measured runs, reusing the
    # memory of the run before, do not see
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


