"""Has the host changed since its profile was measured? (docs/hil.md "Host drift")

A shared VM's kernels move by 10-30 % within an hour (measured on the host: the same INT8 GEMM and the same cold
start's TTFT minutes apart; docs/hil.md "Host drift"), so a prediction from a profile measured an hour ago can be off
by that much for reasons no model of the plan can know. The calibration runs `probe()` first and stores the result
in its measurements (`host_probe`); `experiments.validate diagnostics=true` runs the same probe right before and
right after its cold runs and reports, per probe, how far the host moved since the calibration (`host_drift_pct`,
measured), and a short speed probe (GEMM + elementwise, `speed_probe`) after every cold run gives each run's host
speed relative to the calibration (`run_speeds`; validate's `runs.csv`). The probe right before each run alone
(`speeds_before`) is the device state a prediction for that run may use (validate's "at the pre-run speed"
prediction); the calibrated prediction uses none of it.

Probes (each the median of `reps` timings, thread CPU time so other processes' load does not enter): one INT8 GEMM
at a SmolLM2 FFN shape (16 x 576 x 1536, 1 thread), one set of the float32 elementwise ops at 16 x 576, one
weightlet unpack of a 1536 x 576 tensor at 5 bits into a touched output, and first touch of 32 fresh 1 MiB mappings
(`hil.runner_state.fresh_empty`, as the runner allocates its tensors). On a machine with two or more CPUs also the
same GEMM split over two threads by the runner's native pool (`gemm_mt_s`, wall time: the caller waits for its
helper on the other vCPU), because two vCPUs need not keep one speed together (measured on a Zen 5 VM: the 2-thread
GEMM swung between two speeds while each vCPU alone held one; docs/hil.md "Prediction at the run-time host speed").
Each GEMM thread count is then its own speed class. With a scratch file (`read_path`: the calibration's, or one
`experiments.validate` writes for its runs) also a cold read of its first `READ_PROBE_BYTES` in 1 MiB preads into
one reused buffer, wall and thread CPU time per byte (`read_s_per_byte`, `read_cpu_s_per_byte`): a plan's loads can
move by 1.3-1.7x with the kernel probes unchanged (measured, docs/hil.md "Host drift").
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from hil.calibrate_compute import Kernels
from hil.calibrate_stats import touch_cpu

PROBES = ("gemm_s", "gemm_mt_s", "elementwise_s", "unpack_s", "first_touch_s_per_byte", "read_s_per_byte",
          "read_cpu_s_per_byte")
READ_PROBE_BYTES = 32 << 20   # B read cold per read probe (~10 ms at this host's 3-4 GB/s)
PLACEMENT_HAND_OFFS = 30     # hand-offs per idle gap of a placement probe (the calibration takes 60)


def _cpu_median(fn, calls: int, reps: int, clock=time.thread_time) -> float:
    fn()
    vals = []
    for _ in range(reps):
        c0 = clock()
        for _ in range(calls):
            fn()
        vals.append((clock() - c0) / calls)
    return float(np.median(vals))


def unpack_call(rng: np.random.Generator, C: int = 1536, D: int = 576, bits: int = 5):
    """One native weightlet unpack of a (C, D) tensor at `bits` into an already touched INT8 output."""
    from quant.pack import pack_bits3
    from quant.pack.formats import get_format

    f = get_format("weightlet")
    b = np.full(C, bits, dtype=np.int64)
    codes = rng.integers(-(1 << (bits - 1)), 1 << (bits - 1), (C, D)).astype(np.int8)
    payload = np.ascontiguousarray(f.pack(codes, b, 128, "drift probe"))
    b3, out = pack_bits3(b), np.full((C, D), 1, dtype=np.int8)
    return lambda: f.unpack_native(payload, b3, C, D, 128, out=out)


def read_probe(path: str | Path, reps: int = 3, nbytes: int = READ_PROBE_BYTES) -> dict[str, float]:
    """A cold read of the first `nbytes` of `path` (its page cache evicted first) in 1 MiB preads into one reused
    buffer, `reps` times: the median wall and thread CPU seconds per byte (`read_s_per_byte`, `read_cpu_s_per_byte`)."""
    from hil.calibrate_reads import _fill
    from hil.pagecache import evict
    from hil.runner_state import aligned_empty

    n = min(nbytes, os.path.getsize(path))
    if n == 0:
        raise ValueError(f"read probe: {path} is empty")
    chunk = 1 << 20
    buf = memoryview(aligned_empty(chunk))
    walls, cpus = [], []
    fd = os.open(path, os.O_RDONLY)
    try:
        for _ in range(reps):
            evict(path)
            w0, c0 = time.perf_counter(), time.thread_time()
            for off in range(0, n, chunk):
                _fill(fd, buf[:min(chunk, n - off)], off, chunk, Path(path))
            walls.append((time.perf_counter() - w0) / n)
            cpus.append((time.thread_time() - c0) / n)
    finally:
        os.close(fd)
    return {"read_s_per_byte": float(np.median(walls)), "read_cpu_s_per_byte": float(np.median(cpus))}


def probe(reps: int = 9, touch: bool = True, read_path: str | Path | None = None) -> dict[str, float]:
    """Thread CPU seconds of each probe (module doc), median of `reps`; `touch=False` leaves out first touch (the
    per-run speed probe: a first-touch probe between cold runs would leave freed memory behind for the next run);
    `read_path`: a scratch file to read cold (`read_probe`; None: no read probe)."""
    k = Kernels()
    rng = np.random.default_rng(5)
    gemm = k.gemm_call(16, 576, 1536, 1, rng)
    ew = [c for c, _ in k.elementwise_calls(16, 576, rng).values()]

    def elementwise() -> None:
        for c in ew:
            c()

    out = {"gemm_s": _cpu_median(gemm, 50, reps), "elementwise_s": _cpu_median(elementwise, 50, reps),
           "unpack_s": _cpu_median(unpack_call(rng), 20, reps)}
    if len(os.sched_getaffinity(0)) > 1:      # the runner's 2-thread GEMM (its native pool, pinned apart): wall time
        out["gemm_mt_s"] = _cpu_median(k.gemm_call(16, 576, 1536, 2, rng), 50, reps, time.perf_counter)
    if touch:
        keep: list = []  # every repeat's buffers stay alive until the end (no repeat reuses pages another freed)
        out["first_touch_s_per_byte"] = float(np.median([touch_cpu(32, keep) for _ in range(reps)]))
    if read_path is not None:
        out.update(read_probe(read_path))
    return out


def speed_probe(read_path: str | Path | None = None) -> dict[str, float]:
    """The GEMM (1 and 2 threads), elementwise and unpack probes, 5 repeats, and the read probe when given a scratch
    file (~100 ms here): taken between cold runs."""
    return probe(reps=5, touch=False, read_path=read_path)


def run_speeds(reference: dict[str, float], around: list[dict[str, float]], key: str = "gemm_s"
               ) -> list[float | None]:
    """Host speed during each run relative to its calibration, from the probes taken around the runs (`around[k]`
    before run k, `around[k + 1]` after it): the calibration's probe time / the mean of the two (1.0: as fast as
    when calibrated; 0.7: the same kernel took 1.43x its calibrated CPU time). None where a probe is missing."""
    ref = reference.get(key, 0.0)
    out: list[float | None] = []
    for a, b in zip(around, around[1:]):
        ts = [p[key] for p in (a, b) if p.get(key)]
        out.append(ref / float(np.mean(ts)) if ref > 0 and ts else None)
    return out


SPEED_KEYS = {"gemm": "gemm_s", "gemm_mt": "gemm_mt_s", "elementwise": "elementwise_s", "unpack": "unpack_s",
              "read": "read_s_per_byte", "read_cpu": "read_cpu_s_per_byte"}


def speeds_before(reference: dict[str, float], before: list[dict[str, float]]) -> list[dict[str, float]]:
    """Per run, each kernel class's speed from the probe taken right before it alone (`before[k]`: nothing of run
    k had happened yet, so a prediction from it is a prediction): {"gemm": ref / probe, "elementwise": ...,
    "unpack": ...}, classes without a reference or a probe value left out (planner.cost.scaled's classes)."""
    out = []
    for p in before:
        out.append({cls: reference[key] / p[key] for cls, key in SPEED_KEYS.items()
                    if reference.get(key, 0.0) > 0 and p.get(key, 0.0) > 0})
    return out


def drift_pct(reference: dict[str, float], now: list[dict[str, float]]) -> dict[str, float]:
    """Per probe: 100 x (median of the `now` probes / the reference - 1); probes missing from either are left out."""
    out = {}
    for key in PROBES:
        vals = [n[key] for n in now if key in n]
        if vals and reference.get(key, 0) > 0:
            out[key] = 100.0 * (float(np.median(vals)) / reference[key] - 1.0)
    return out


def placement_probe(hand_offs: int = PLACEMENT_HAND_OFFS) -> list[dict] | None:
    """The calibration's wake-up placement probe (`hil.calibrate_compute.measure_wake_pack`, `hand_offs` per gap):
    where the OS puts a thread woken while its waker computes, now. On the host VM that placement moves within the
    hour (measured: 0.10 and 0.60 of the hand-offs packed half an hour apart; docs/hil.md "Wake-up packing"), so
    `experiments.validate diagnostics=true` runs it right before and right after its cold runs. None where the
    calibration's probe is (one core, no sched_getcpu)."""
    from hil.calibrate_compute import measure_wake_pack
    from hil.calibrate_settings import CalibrationSettings

    return measure_wake_pack(Kernels(), CalibrationSettings(), hand_offs)


def merge_placements(probes: list[list[dict] | None]) -> list[dict] | None:
    """Several `placement_probe` curves as one: per gap, the mean idle time and the mean share (None if any is)."""
    if not probes or any(p is None for p in probes):
        return None
    out = []
    for rows in zip(*probes):
        if len({r["gap_us"] for r in rows}) != 1:
            raise ValueError("placement probes measured different gaps")
        out.append(dict(gap_us=rows[0]["gap_us"], idle_s=float(np.mean([r["idle_s"] for r in rows])),
                        share=float(np.mean([r["share"] for r in rows]))))
    return out
