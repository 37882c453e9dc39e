"""How much more CPU time work takes while another core is busy (docs/hil.md "Co-running cores").

Calibrated alone, the runner's work costs less CPU than it does in a plan, where the other core is busy with another
worker. Measured on a 2-core KVM guest (docs/hil.md "Co-running cores"): first touch of fresh memory 0.42 ns/B
alone, 0.47 with a GEMM loop on the other core, 0.50 with another thread touching fresh memory, 0.47 with a cold
reader or a memcpy; an INT8 GEMM only 3 % more beside another GEMM. And it depends on what the other core runs: a
cold read into fresh buffers took 1.0x its CPU beside a GEMM loop, 1.12-1.17x beside a second cold reader and
1.23-1.24x beside a thread faulting fresh pages (three runs of 5-9 alternating sets); elementwise ops 1.6x beside a
GEMM loop, 1.06-1.10x beside first touch. A plan's loaders run side by side and beside the unpacker's first touch.

So each class of work the simulator charges to the cores is timed here in thread CPU time alone, with one CPU-bound
compute co-runner on the other core (a loop of native GEMM calls, as the runner's workers run) and with one
memory-system co-runner there (first touch of fresh mappings, what the runner's loaders and unpacker mostly spend
their CPU on), alternately (`CoRunner`). The compute co-runner runs in another process: beside a co-runner thread of
this process the probes also paid the interpreter lock's hand-offs (unpack 1.42x, GEMM 1.18x; 1.03x and 0.99x beside
the same work in another process), which the simulator models apart (`HostRuntime.interpreter_lock`). The memory
co-runner is a thread of this process: its page faults contend with the probe's on the process's address space, as
the runner's threads' do (unpack 1.34x, touch 1.20x; ~1.0x from another process). Per class the ratio
busy / alone, per busy core (the excess divided by the co-runner's CPU utilisation over the window), is
`HostRuntime.corun_<class>` (beside compute) and `corun_<class>_mem` (beside memory work); the simulator
(`sim.sharing.Cores`) slows a job of that class by them while other threads' compute or memory work occupies the
other cores.

Classes: `gemm` (INT8 GEMM, 16 x 576 x 1536, 1 thread, weights just copied into fresh pages), `elementwise` (the
float32 ops at 16 x 576: activations, cache-resident in a run too), `unpack` (5-bit weightlet unpack of a freshly
copied payload into a fresh, faulted-in output), `touch` (first touch: a copy into fresh 1 MiB mappings),
`read` (a cold read into fresh buffers), `runtime` (the runner's own per-task code: the tiny-model sequential run's
op, load and unpack cycles, hil.calibrate_runner).
"""
from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

import native
from hil.calibrate_compute import Kernels
from hil.calibrate_reads import cold_read
from hil.calibrate_settings import CalibrationSettings
from hil.calibrate_stats import MIB, Stat, touch_cpu
from hil.runner_state import fresh_empty
from native.compute import aligned, aligned_copy
from planner.host_runtime import CORUN_CLASSES as CLASSES


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
    # GEMM weights and unpack payloads / outputs as in the runner: each call's inputs just copied into fresh pages (a
    # loader's buffer), an unpack's output fresh and faulted in before the call; only the kernel is timed. Probes on
    # one L2-resident working set, or on one cycled through 64 MiB of old buffers, measured the unpack x1.0-1.13
    # beside other work, where the runner's own sequence (fresh payload copy, fresh output, kernel) measured x1.25-1.3
    # beside a GEMM loop or a cold reader (its kernels 11.4 ms alone, 14-15 beside; measured, docs/hil.md)
    w0 = rng.integers(-127, 128, size=(1536, 576), dtype=np.int8)
    x = aligned_copy(rng.integers(-127, 128, size=(16, 576), dtype=np.int8))   # cache-line aligned, as the runner's
    y = aligned((16, 1536), np.int32)
    C, D = 1536, 576
    q = rng.integers(-15, 16, size=(C, D), dtype=np.int8)
    bits = np.full(C, 5, dtype=np.int8)
    from native import compute as nc
    from quant.pack.formats import BY_CODE
    from quant.pack.layout import pack_bits3

    fmt = next(f for f in BY_CODE.values() if f.name == "weightlet")
    payload = np.frombuffer(fmt.pack(q, bits, 128, "probe"), dtype=np.uint8)
    bits3 = pack_bits3(bits)

    def fresh_copy(a: np.ndarray) -> np.ndarray:
        b = fresh_empty(a.nbytes)
        native.memcpy(b, a.reshape(-1).view(np.uint8))
        return b.view(a.dtype).reshape(a.shape)

    def gemm(k: int = 40) -> float:
        """s per call: an INT8 GEMM on weights just copied into fresh pages."""
        t = 0.0
        for _ in range(k):
            w = fresh_copy(w0)
            c0 = time.thread_time()
            nc.gemm_i8_i32(x, w, out=y)
            t += time.thread_time() - c0
        return t / k

    def unpack(k: int = 40) -> float:
        """s per call: a 5-bit unpack of a payload just copied into fresh pages into a fresh, faulted-in output."""
        t = 0.0
        for _ in range(k):
            p = fresh_copy(payload)
            out = fresh_empty(C * D).view(np.int8).reshape(C, D)
            out.reshape(-1)[::4096] = 0
            c0 = time.thread_time()
            fmt.unpack_native(p, bits3, C, D, 128, out=out)
            t += time.thread_time() - c0
        return t / k

    ew = [c for c, _ in k.elementwise_calls(16, 576, rng).values()]
    def touch() -> float:
        """s per B of copying into 64 fresh 1 MiB mappings, all kept until the end (each phase starts from the memory
        the previous one released)."""
        return touch_cpu(64)

    def read() -> float:
        _, cpu = cold_read(path, MIB, MIB, fresh=True)
        return cpu / path.stat().st_size

    def elementwise() -> None:
        for c in ew:
            c()

    return {"gemm": (gemm, 0), "elementwise": (elementwise, 300),
            "unpack": (unpack, 0), "touch": (touch, 0),
            "read": (read, 0), "runtime": (runtime, 0)}


def _corunner_main(kind: str, go, stop, ready, idle, cpu, wall) -> None:
    """The co-runner (`CoRunner`, a process or a thread): while `go` is set, `kind` work in a loop ("compute": the
    16 x 576 x 576 INT8 GEMM of `hil.calibrate_compute.busy_cores`; "memory": copies into fresh 1 MiB mappings,
    256 MiB held then released); adds each busy window's CPU and wall seconds to `cpu` / `wall`, sets `idle` after."""
    import time as _time

    if kind == "compute":
        call = Kernels().gemm_call(16, 576, 576, 1, np.random.default_rng(7))
    else:
        src = np.ones(MIB, dtype=np.uint8)
        keep: list[np.ndarray] = []

        def call() -> None:
            buf = fresh_empty(MIB)
            native.memcpy(buf, src)
            keep.append(buf)
            if len(keep) >= 256:
                keep.clear()
    call()
    ready.set()
    while not stop.is_set():
        if not go.wait(0.05):
            continue
        idle.clear()
        c0, t0 = _time.thread_time(), _time.perf_counter()
        while go.is_set():
            call()
        cpu.value += _time.thread_time() - c0
        wall.value += _time.perf_counter() - t0
        idle.set()


class _Value:
    """A float with `.value`, as multiprocessing.Value has (the in-process co-runner's counters)."""

    def __init__(self) -> None:
        self.value = 0.0


class CoRunner:
    """CPU-bound work on the other core, switched on for the blocks of `busy()`: "compute" (a loop of native INT8
    GEMM calls, as the runner's workers run), from another process, or "memory" (first touch of fresh mappings, what
    a plan's loaders and unpacker mostly spend their CPU on), from a thread of this process.

    Compute from another process: a co-runner thread in this process takes the interpreter lock around each of its
    native calls, and the probe thread re-taking it after its own call pays the hand-off in its CPU time. Measured
    on the host (7 alternating sets; docs/hil.md "Co-running cores"): beside a co-runner thread the GEMM probe took
    1.18x its CPU alone, the unpack 1.42x, elementwise 1.28x; beside the same loop in another process 0.99x, 1.03x,
    1.00x; beside a thread making one 30 ms GEMM call per lock hand-off 1.06x, 1.04-1.08x, 1.0x. So what a co-runner
    thread adds is the interpreter lock's hand-offs, which the simulator models on their own
    (`HostRuntime.interpreter_lock`, `thread_wake_cpu_s`), and the two are not counted twice.
    Memory work from this process: page faults and new mappings of threads of one process contend on its address
    space (the mm's locks and page tables), as the runner's loaders and unpacker do, and another process does not
    share them: beside the same first-touch loop the probes took unpack 1.34x, touch 1.20x, cold read 1.16x from a
    thread of this process and 0.97x, 1.00x, 1.00x from another process (5 alternating sets). Its interpreter-lock
    traffic is one hand-off per 1 MiB copy (~0.3 ms). `utilisation()`: the co-runner's CPU / wall time over the busy
    blocks."""

    def __init__(self, kind: str) -> None:
        if kind not in ("compute", "memory"):
            raise ValueError(f"CoRunner: kind must be compute or memory (got {kind!r})")
        import multiprocessing as mp
        import threading

        if kind == "compute":
            ctx = mp.get_context("spawn")              # no fork of a threaded process
            self.go, self.stop, self.ready, self.idle = ctx.Event(), ctx.Event(), ctx.Event(), ctx.Event()
            self.cpu, self.wall = ctx.Value("d", 0.0), ctx.Value("d", 0.0)
            make = ctx.Process
        else:
            self.go, self.stop, self.ready, self.idle = (threading.Event() for _ in range(4))
            self.cpu, self.wall = _Value(), _Value()
            make = threading.Thread
        self.proc = make(target=_corunner_main, name=f"corun-{kind}", daemon=True,
                         args=(kind, self.go, self.stop, self.ready, self.idle, self.cpu, self.wall))

    def __enter__(self) -> "CoRunner":
        self.proc.start()
        try:
            if not self.ready.wait(60.0):
                raise RuntimeError("calibrate: the co-runner did not start within 60 s")
        except BaseException:
            self._end()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._end()

    def _end(self) -> None:
        self.go.clear()
        self.stop.set()
        self.proc.join(5.0)
        if self.proc.is_alive() and hasattr(self.proc, "terminate"):
            self.proc.terminate()
            self.proc.join(5.0)

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        self.idle.clear()
        self.go.set()
        time.sleep(0.02)                               # under way on its core
        try:
            yield
        finally:
            self.go.clear()
            self.idle.wait(5.0)

    def utilisation(self) -> float:
        return self.cpu.value / self.wall.value if self.wall.value > 0 else 1.0


def _per_busy_core(ratio: float, util: float) -> float:
    """A busy / alone ratio measured beside a co-runner that used `util` of its core, per fully busy core."""
    return 1.0 + (ratio - 1.0) / min(1.0, max(0.05, util))


def measure_corun(s: CalibrationSettings, path: Path, runtime: Callable[[], float]) -> dict[str, Stat]:
    """Per class: thread CPU beside a compute thread / alone (key `<class>`) and beside memory-system work, per busy
    core (key `<class>_mem`) (medians over `reps_noisy` alternating triples; spread of the ratios). `path`: an evicted
    file to read cold; `runtime`: returns the runner's per-task time of one tiny-model run."""
    probes = _probes(s, path, runtime)
    ratios: dict[str, list[float]] = {k: [] for c in CLASSES for k in (c, f"{c}_mem")}
    with CoRunner("compute") as comp, CoRunner("memory") as mem:
        for _ in range(max(3, s.reps_noisy)):
            alone = {c: _cpu(fn, n) for c, (fn, n) in probes.items()}
            with comp.busy():
                busy = {c: _cpu(fn, n) for c, (fn, n) in probes.items()}
            w0, c0 = mem.wall.value, mem.cpu.value
            with mem.busy():
                busy_mem = {c: _cpu(fn, n) for c, (fn, n) in probes.items()}
            util = (mem.cpu.value - c0) / max(mem.wall.value - w0, 1e-9)
            for c in CLASSES:
                if alone[c] > 0:
                    ratios[c].append(busy[c] / alone[c])
                    ratios[f"{c}_mem"].append(_per_busy_core(busy_mem[c] / alone[c], util))
    return {k: Stat.of(v or [1.0]) for k, v in ratios.items()}
