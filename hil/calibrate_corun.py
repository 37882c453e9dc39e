"""How much more CPU time work takes while another core is busy (docs/hil.md "Co-running cores").

Calibrated alone, the runner's work costs less CPU than it does in a plan, where the other core is busy with another
worker: on this 2-core KVM guest, first touch of fresh memory measured 0.42 ns/B alone, 0.47 with a GEMM loop on the
other core, 0.50 with another thread touching fresh memory, 0.47 with a cold reader or a memcpy (2026-12-01); an
INT8 GEMM only 3 % more beside another GEMM. So each class of work the simulator charges to the cores is timed here
in thread CPU time alone and with one CPU-bound thread on the other core (`hil.calibrate.busy_cores`, a Python loop
of native GEMM calls, as the runner's workers are), alternately; the ratio busy / alone per class is
`SocProfile.corun_*` and the simulator (`sim.sharing.Cores`) slows a job of that class by it while the other cores
are in use by other threads.

Classes: `gemm` (INT8 GEMM, 16 x 576 x 1536, 1 thread), `elementwise` (the float32 ops at 16 x 576),
`unpack` (5-bit weightlet unpack into a touched output), `touch` (first touch: a copy into fresh 1 MiB mappings),
`read` (a cold read into fresh buffers), `runtime` (the runner's own per-task code: the tiny-model sequential run's
op, load and unpack cycles, hil.calibrate_runner).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import numpy as np

import native
from hil.calibrate import MIB, CalibrationSettings, Kernels, Stat, busy_cores, cold_read
from hil.runner_state import fresh_empty
from planner.device import CORUN_CLASSES as CLASSES


def _cpu(fn: Callable[[], object], n: int) -> float:
    """Thread CPU seconds per call, over `n` calls of fn; n = 0: fn measures itself and returns s per unit."""
    if n == 0:
        return float(fn())
    c0 = time.thread_time()
    for _ in range(n):
        fn()
    return (time.thread_time() - c0) / n


def _probes(s: CalibrationSettings, path: Path, runtime: Callable[[], float]) -> dict[str, tuple[Callable, int]]:
    k = Kernels()
    rng = np.random.default_rng(11)
    gemm = k.gemm_call(16, 576, 1536, 1, rng)
    ew = [c for c, _ in k.elementwise_calls(16, 576, rng).values()]
    C, D = 1536, 576
    q = rng.integers(-15, 16, size=(C, D), dtype=np.int8)
    bits = np.full(C, 5, dtype=np.int8)
    from quant.pack.formats import BY_CODE
    from quant.pack.layout import pack_bits3

    fmt = next(f for f in BY_CODE.values() if f.name == "weightlet")
    payload = np.frombuffer(fmt.pack(q, bits, 128, "probe"), dtype=np.uint8)
    bits3 = pack_bits3(bits)
    out = np.ones((C, D), dtype=np.int8)
    src = np.ones(MIB, dtype=np.uint8)

    def touch(k: int = 64) -> float:
        """s per B of copying into k fresh 1 MiB mappings, all kept until the end (each phase starts from the memory
        the previous one released)."""
        bufs = [fresh_empty(MIB) for _ in range(k)]
        c0 = time.thread_time()
        for b in bufs:
            native.memcpy(b, src)
        return (time.thread_time() - c0) / (k * MIB)

    def read() -> float:
        _, cpu = cold_read(path, MIB, MIB, fresh=True)
        return cpu / path.stat().st_size

    def elementwise() -> None:
        for c in ew:
            c()

    return {"gemm": (gemm, 200), "elementwise": (elementwise, 300),
            "unpack": (lambda: fmt.unpack_native(payload, bits3, C, D, 128, out=out), 30), "touch": (touch, 0),
            "read": (read, 0), "runtime": (runtime, 0)}


def measure_corun(s: CalibrationSettings, path: Path, runtime: Callable[[], float]) -> dict[str, Stat]:
    """Per class: thread CPU busy / alone (median over `reps_noisy` alternating pairs; spread of the ratios).
    `path`: an evicted file to read cold; `runtime`: returns the runner's per-task time of one tiny-model run."""
    probes = _probes(s, path, runtime)
    ratios: dict[str, list[float]] = {c: [] for c in CLASSES}
    for _ in range(max(3, s.reps_noisy)):
        alone = {c: _cpu(fn, n) for c, (fn, n) in probes.items()}
        with busy_cores(1):
            busy = {c: _cpu(fn, n) for c, (fn, n) in probes.items()}
        for c in CLASSES:
            ratios[c].append(busy[c] / alone[c] if alone[c] > 0 else 1.0)
    return {c: Stat.of(v) for c, v in ratios.items()}
