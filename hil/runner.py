"""Host HIL runner: executes a bound cold-start `Plan` for real on this machine and measures it (docs/hil.md
"Runner"; EdgeFlow §4.3 granular pipeline and dynamic dispatch, §4.1 W8A8 NPU linear layers).

`run_plan(plan, packed_path, tokens)` runs the plan of any framework policy on a packed model file and returns the
measured `Timeline` (source "measured", seconds from t0 = the start of the cold start) plus the logits of the last
prompt token. Before t0: the file is evicted from the page cache (hil.pagecache) and its resident fraction recorded
(0.0 = every weight byte comes from disk); then, timed as `info["open_to_t0_s"]` (from the open to t0), its index is
read, every compute buffer is allocated and zero-filled (KV cache, RoPE tables, chunk activations), the ops are
compiled into steps and the worker and GEMM helper threads are started; the weights are not touched before t0. TTFT
from the open (open_to_t0_s + the timeline's end) is the clock a peer runtime's own load is compared with (hil.peer).
Threads (one OS thread per plan worker, like the simulator's processes in sim.executor): `plan.loader_threads`
loaders, `plan.unpack_threads` unpackers, `plan.graph_threads` graph threads, one `cpu` worker (its GEMMs split over
`plan.cpu_threads` threads: native helpers that poll 100 us for the next GEMM and are pinned away from the worker's
CPU, hil.runner_state.gemm_pool) and one `npu` worker. THE NPU WORKER IS A STAND-IN: this host has no NPU, so a CPU
thread runs the NPU queue (INT8 matmuls in EdgeFlow's fine placement; whole subgraphs in llm.npu's coarse placement)
with the same native INT8 kernels; its spans carry unit "npu" so traces show which work the plan put on the NPU.
Dispatch: `planner.pipeline.dispatch.Dispatcher` (the simulator's rules: static / position priority, CPU stealing of
NPU INT8 matmuls) under one lock, one Condition per resource. Stolen ops run on the cpu worker (span resource "cpu",
stolen=True). Per resource:
- load: pread of the task's byte ranges into page-aligned buffers in `request_bytes` requests, one native call per task
  (`native.read_pieces`: the thread re-takes the interpreter lock once per task); `copy_bytes` > 0 (or
  `duration_s` > 0: a phone's materialized-graph deserialization, whose host stand-in is the same copy) -> a real
  native memcpy into a second ("NPU") buffer. Every span's `cpu_s` is the CPU time its thread used in it
  (`time.thread_time`: syscalls, copies and page faults included; wall minus `cpu_s` = waiting for data or a core).
  The embedding task reads the row scales in
  one sequential read and the prompt's rows one read each (ascending offsets, on a second descriptor advised
  POSIX_FADV_RANDOM so no readahead is triggered), then dequantizes them.
- unpack: native unpack of the task's tensors to INT8 (an INT8 blob is a zero-copy view).
- graph: nothing to do on this host; a task with `duration_s` > 0 is refused (the plan targets a device with NPU
  graphs: build it for device=host or zero the graph durations).
- cpu / npu: the task's ops (hil.runner_ops) on its chunk.
Any error in a worker stops every worker; all threads are joined and one RuntimeError names the task.
"""
from __future__ import annotations

import gc
import os
import resource
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import native
from hil.packed_index import EMBED, FileIndex, check_spec, read_index
from hil.pagecache import evict_cold, resident_fraction
from hil.runner_ops import OpRunner, needed_tensors
from hil.runner_state import RunState, WeightStore, aligned_empty, fresh_empty, gemm_pool, run_state
from planner.pipeline.builder import chunks
from planner.pipeline.dispatch import QUEUED, Dispatcher
from planner.plan import Plan, Task
from planner.timeline import Span, Timeline
from quant.arch import ModelSpec
from quant.pack.container import verify_file
from quant.pack.formats import BY_CODE, F32_CODE
from quant.pack.layout import pack_bits3

STALL_S = 5.0     # s without progress while every worker waits -> the plan deadlocked
SWITCH_INTERVAL_S = 2e-4   # s, Python's GIL switch interval during a run (default 5e-3: an I/O or hand-off would wait
#                            up to 5 ms for a thread busy in Python code)
# The cyclic garbage collector is off during a run (as timeit does): a collection holds the GIL for its whole pass over
# the process's objects, and in the validate app's process (Hydra, the simulated timelines) one took tens of ms,
# stalling every worker: llama.cpp-style 16 tokens measured 142 ms with it, 125 ms without (measured on the host,
# docs/hil.md); reference counting still frees the run's buffers. A native runtime has no such pause, so it is not
# modelled.


@dataclass
class RunResult:
    timeline: Timeline               # measured spans, s from t0
    logits: np.ndarray               # (vocab,) float32, last prompt token
    token: int                       # argmax of logits (greedy first token)
    resident_before: float           # page-cache resident fraction of the file at t0 (0.0 after eviction)
    info: dict = field(default_factory=dict)   # lazy unpacks, embedding waits, ...


def _voluntary_switches() -> int:
    """Voluntary context switches of the calling thread so far (it blocked: a Condition, the interpreter lock, a read
    waiting for the device); Linux's getrusage(RUSAGE_THREAD)."""
    return resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw


def _check_bound(plan: Plan, ix: FileIndex) -> None:
    if not plan.info.get("bound"):
        raise ValueError(f"plan {plan.framework}: not bound to a packed file (call hil.packed_index.bind_to_file "
                         f"or planner.pipeline.bind.bind_plan first)")
    for t in plan.tasks:
        for r in t.tensors:
            e = ix.entries.get(r.name)
            if e is None:
                raise ValueError(f"plan task {t.name}: tensor {r.name!r} is not in {ix.path}")
            ok = (e.offset <= r.offset and r.offset + r.nbytes <= e.offset + e.size) if t.resource == "load" \
                else (r.offset, r.nbytes) == (e.offset, e.size)
            if not ok and not (t.ops == ["embed"]):
                raise ValueError(f"plan task {t.name}: tensor {r.name!r} is bound to bytes {r.offset}+{r.nbytes}, "
                                 f"not to {ix.path} ({e.offset}+{e.size}): bind the plan to this file")


class _Run:
    def __init__(self, plan: Plan, ix: FileIndex, spec: ModelSpec, tokens: np.ndarray, isa: str | None) -> None:
        self.plan, self.ix, self.spec, self.tokens, self.isa = plan, ix, spec, tokens, isa
        sizes = chunks(plan.prompt_tokens, plan.chunk_tokens)
        self.rs: RunState = run_state(spec, sizes)
        self.ws = WeightStore(ix, isa)
        n_help = max(plan.cpu_threads - 1, 0)        # native GEMM helpers, started now (not inside the first GEMM)
        self.pool = gemm_pool(n_help) if n_help else None
        try:
            self.ops = OpRunner(self.rs, self.ws, ix.act_scales, isa, self.pool)
            self.ops.prepare(plan.tasks, plan.cpu_threads)     # every compute task's steps, before t0
        except BaseException:
            self.close()
            raise
        self.dispatch = Dispatcher(plan)
        self.needs = {t.id: needed_tensors(t) for t in plan.tasks if t.resource in ("cpu", "npu")}   # weights read
        self.lock = threading.Lock()
        self.cond = {r: threading.Condition(self.lock) for r in QUEUED}
        self.spans: list[Span] = []
        self.error: tuple[Task | None, BaseException] | None = None
        self.mem = self.peak = 0
        self.mem_samples: list[tuple[float, int]] = [(0.0, 0)]
        self.bytes_read = 0
        self.running = 0
        self.waiting = 0
        self.embedded = threading.Event()
        self.stop = threading.Event()                 # set when every task ran or a worker failed
        self.go = threading.Event()                   # workers start (threads exist before t0)
        self.implicit_waits: list[str] = []          # compute tasks that waited for data the plan did not order
        self.faulted: list[str] = []                 # task:tensor read by a compute task itself (see _inputs_ready)
        self.faulted_bytes = 0
        self.fd_random = -1
        self.local = threading.local()                     # per-thread file descriptor (see _read)
        self.fds: list[int] = []
        self.t0 = 0.0
        self.thread_ids: dict[int, str] = {}             # kernel thread id -> worker ("load0", "cpu0", ...)
        self.switches: dict[str, int] = {}               # worker -> its voluntary context switches from t0 on
        self.ru_start: resource.struct_rusage | None = None   # process rusage at t0 and when the last task ended:
        self.ru_end: resource.struct_rusage | None = None     # Timeline.core_busy_s (user + system) and .waits

    # ---- bookkeeping (under self.lock) -----------------------------------------------------------------------
    def _now(self) -> float:
        return time.perf_counter() - self.t0

    def _mem(self, delta: int) -> None:
        if delta:
            self.mem += delta
            self.peak = max(self.peak, self.mem)
            self.mem_samples.append((self._now(), self.mem))

    def _after(self, wake: list[str], joins: list[int]) -> None:
        for j in joins:
            self._mem(-self.plan.tasks[j].mem_free)
        for r in set(wake):
            self.cond[r].notify_all()
        if self.dispatch.finished:
            if self.ru_end is None:                       # the process's CPU and context switches at the end
                self.ru_end = resource.getrusage(resource.RUSAGE_SELF)
            for c in self.cond.values():
                c.notify_all()
            self.stop.set()

    def _abort(self, task: Task | None, exc: BaseException) -> None:
        with self.lock:
            if self.error is None:
                self.error = (task, exc)
            for c in self.cond.values():
                c.notify_all()
        self.embedded.set()
        self.stop.set()

    # ---- workers ---------------------------------------------------------------------------------------------
    def worker(self, resource: str, idx: int) -> None:
        """One plan worker: pop the next task of `resource`, run it, record its span. Completing a task and popping
        the next happen under one acquisition of the run's lock (the loop's only one when the task's inputs are in
        memory): the runner's own cost per task, and its contention between five threads, stay small."""
        task = None
        done: tuple | None = None                    # (task, start, end, unit, stolen, cpu_s) just run by this thread
        self.thread_ids[threading.get_native_id()] = f"{resource}{idx}"   # the kernel's id (diagnostics.schedtrace)
        self.go.wait()
        nv0 = _voluntary_switches()
        try:
            while True:
                with self.lock:
                    if done is not None:
                        self._finish(resource, idx, *done)
                        done = None
                    while True:
                        if self.error is not None or self.dispatch.finished:
                            return
                        got = self.dispatch.pop(resource)
                        if got is not None:
                            break
                        self.waiting += 1
                        self.cond[resource].wait()
                        self.waiting -= 1
                    tid, stolen, wake = got
                    self._after(wake, [])
                    self.running += 1
                    task = self.plan.tasks[tid]
                    ready = resource not in ("cpu", "npu") or self._ready(task)
                    if ready:
                        start = self._now()
                        self._mem(task.mem_alloc)
                if not ready:
                    if not self._inputs_ready(task):
                        return
                    with self.lock:
                        start = self._now()
                        self._mem(task.mem_alloc)
                c0 = time.thread_time()
                unit = self._execute(task, resource, idx, stolen)
                cpu_s = time.thread_time() - c0          # CPU seconds this thread used in the span (measured)
                done, task = (task, start, self._now(), unit, stolen, cpu_s), None
        except BaseException as e:     # noqa: BLE001 - reported once by run()
            self._abort(task, e)
        finally:
            self.switches[f"{resource}{idx}"] = _voluntary_switches() - nv0

    def _finish(self, resource: str, idx: int, task: Task, start: float, end: float, unit: str, stolen: bool,
                cpu_s: float) -> None:
        """Record a task's span and complete it in the dispatcher (under self.lock)."""
        self.spans.append(Span(task.id, "cpu" if stolen else resource, idx, start, end, unit, stolen, cpu_s))
        self._mem(-task.mem_free)
        self.running -= 1
        self._after(*self.dispatch.complete(task.id))

    def _ready(self, t: Task) -> bool:
        """Whether the embedding and every weight compute task `t` reads are in memory already (no lock: dictionary
        reads; the common case, when the plan's dependencies ordered the loads)."""
        if not self.embedded.is_set():
            return False
        ready, events = self.ws.ready, self.ws.events
        for name in self.needs[t.id]:
            if name not in ready:
                ev = events.get(name)
                if ev is None or not ev.is_set():
                    return False
        return True

    def _inputs_ready(self, t: Task) -> bool:
        """Make sure the data a compute task reads is in memory before its span starts: the prompt's embedding and
        the task's weights. A correct plan orders this through its dependencies. Where a plan leaves an edge out
        (only the matmuls of a layer wait for `layer_ready`, so a layer's first op, attn_norm, and the final norm
        may start before their float32 norm vector is read), the task faults the missing float32 tensor in itself
        with one pread, as a touch of an mmap'ed page would (counted in bytes_read and in
        RunResult.info["faulted"]); for an INT8 weight it waits for the load (info["implicit_waits"])."""
        evs = [] if self.embedded.is_set() else [self.embedded]
        for name in self.needs[t.id]:
            ev = self.ws.arrived(name)
            if ev.is_set() or name in self.ws.ready:
                continue
            e = self.ix.entries[name]
            if e.fmt == F32_CODE:
                buf = fresh_empty(e.size)
                self._read([buf], [e.offset], max(e.size, 1))
                self.ws.fault_in(name, buf)
                with self.lock:
                    self.faulted.append(f"{t.name}:{name}")
                    self.faulted_bytes += e.size
            else:
                evs.append(ev)
        if evs:
            with self.lock:
                self.implicit_waits.append(t.name)
                self.waiting += 1
            try:
                for ev in evs:
                    while not ev.wait(0.05):
                        if self.error is not None:
                            return False
            finally:
                with self.lock:
                    self.waiting -= 1
        return self.error is None

    def _execute(self, t: Task, resource: str, idx: int, stolen: bool) -> str:
        """Run task `t`; returns the unit its span is labelled with."""
        if resource == "load":
            if t.ops == ["embed"]:
                self._embed(t)
            else:
                self._load(t)
            return "io"
        if resource == "graph":
            if t.duration_s > 0:
                raise ValueError(f"plan built for a device with an NPU graph (duration_s={t.duration_s:g}); "
                                 f"build it for device=host")
            return "graph"
        if resource == "unpack":
            for r in t.tensors:
                self.ws.unpack(r.name)
            return "cpu"
        threads = self.plan.cpu_threads if (resource == "cpu" or stolen) else 1
        self.ops.run(t, threads)
        return "cpu" if resource == "cpu" or stolen else "npu"

    def _fd(self) -> int:
        """This loader thread's own descriptor of the file: one shared file position would make the kernel see two
        interleaved streams as random access (no readahead)."""
        fd = getattr(self.local, "fd", None)
        if fd is None:
            fd = self.local.fd = os.open(self.ix.path, os.O_RDONLY)
            with self.lock:
                self.fds.append(fd)
        return fd

    def _read(self, bufs: list[np.ndarray], offs: list[int], request: int, fd: int | None = None,
              copies: list[np.ndarray | None] | None = None) -> None:
        """Fill every `bufs[i]` from file offset `offs[i]` in pread requests of at most `request` bytes (then copy it
        into `copies[i]` where given): one native call without the interpreter lock for all of them
        (`native.read_pieces`), so the thread re-takes the lock once per task, not once per request."""
        n = native.read_pieces(self._fd() if fd is None else fd, bufs, offs, max(1, request), copies, self.ix.path)
        with self.lock:
            self.bytes_read += n

    def _load(self, t: Task) -> None:
        copy = t.copy_bytes > 0 or t.duration_s > 0
        req = t.request_bytes or (1 << 20)
        pieces, offs, copies = [], [], []
        for r in t.tensors:
            e = self.ix.entries[r.name]
            lo = r.offset - e.offset
            pieces.append(self.ws.blob(r.name).buf[lo:lo + r.nbytes])
            offs.append(r.offset)
            copies.append(self.ws.npu_buffer(r.name)[lo:lo + r.nbytes] if copy else None)
        self._read(pieces, offs, req, copies=copies if copy else None)
        for r in t.tensors:
            self.ws.landed(r.name, r.nbytes, copy)

    def _embed(self, t: Task) -> None:
        """Read the prompt's rows (+ their float32 scales) of the INT8 embedding and dequantize into the chunks."""
        e = self.ix.entries[EMBED]
        row = self.ix.embed_row_payload
        uniq, inv = np.unique(self.tokens, return_inverse=True)
        payload = aligned_empty(row * uniq.size)
        all_scales = np.empty(e.C, np.float32)               # one sequential read of the row scales (4 B per row)
        self._read([all_scales.view(np.uint8)], [e.offset + e.scales_off], all_scales.nbytes)
        scales = all_scales[uniq]
        self._read([payload[i * row:(i + 1) * row] for i in range(uniq.size)],   # the prompt's rows, ascending
                   [e.offset + e.payload_off + int(tok) * row for tok in uniq],   # offsets, no readahead
                   t.request_bytes or row, self.fd_random)
        bits3 = pack_bits3(np.full(uniq.size, 8, dtype=np.int8))
        q = BY_CODE[e.fmt].unpack_native(payload, bits3, uniq.size, e.D, e.group, isa=self.ws.unpack_isa)
        x = (q.astype(np.float32) * scales[:, None])[inv]                       # (T, d)
        for c in self.rs.chunks:
            c.x[:] = x[c.past:c.past + c.m]
        self.embedded.set()

    # ---- driver ----------------------------------------------------------------------------------------------
    def run(self) -> Timeline:
        threads = [threading.Thread(target=self.worker, args=(r, i), name=f"hil-{r}{i}", daemon=True)
                   for r in QUEUED for i in range(self.plan.workers(r))]
        self.fd_random = os.open(self.ix.path, os.O_RDONLY)      # scattered reads: readahead off for this fd only
        os.posix_fadvise(self.fd_random, 0, 0, os.POSIX_FADV_RANDOM)
        try:
            if not any(t.ops == ["embed"] for t in self.plan.tasks):
                raise ValueError(f"plan {self.plan.framework}: no embedding task (ops == ['embed'])")
            for th in threads:
                th.start()
            self.ru_start = resource.getrusage(resource.RUSAGE_SELF)
            self.t0 = time.perf_counter()
            with self.lock:
                self._after(*self.dispatch.start())
            self.go.set()
            last, last_t = -1, time.perf_counter()
            while not self.stop.wait(0.1):
                with self.lock:
                    if self.dispatch.done != last or self.running:
                        last, last_t = self.dispatch.done, time.perf_counter()
                    elif self.waiting == len(threads) and time.perf_counter() - last_t > STALL_S:
                        self.error = (None, RuntimeError(f"plan deadlocked: {self.dispatch.done}/"
                                                         f"{len(self.plan.tasks)} tasks ran"))
                        for c in self.cond.values():
                            c.notify_all()
                        break
        finally:
            self._abort_if_running(threads)
            for th in threads:
                if th.ident is not None:
                    th.join()
            self.close()
            for fd in self.fds:
                os.close(fd)
            os.close(self.fd_random)
        if self.error is not None:
            task, exc = self.error
            where = f"task {task.name} ({task.resource})" if task is not None else "dispatch"
            raise RuntimeError(f"hil run failed in {where}: {type(exc).__name__}: {exc}") from exc
        if not self.dispatch.finished:
            raise RuntimeError(f"plan deadlocked: {self.dispatch.done}/{len(self.plan.tasks)} tasks ran")
        end = max((s.end for s in self.spans), default=0.0)
        a, b = self.ru_start, self.ru_end
        busy = waits = None
        if a is not None and b is not None:
            busy = (b.ru_utime + b.ru_stime) - (a.ru_utime + a.ru_stime)
            waits = b.ru_nvcsw - a.ru_nvcsw
        return Timeline(self.plan, self.spans, end, self.bytes_read, self.peak, [], self.mem_samples,
                        source="measured", core_busy_s=busy, waits=waits,
                        waits_by_thread=dict(sorted(self.switches.items())))

    def close(self) -> None:
        """Stop the native GEMM helpers and drop the compiled steps (idempotent). The steps are closures over the
        op runner, a reference cycle: without this the run's buffers (every weight) would wait for the cyclic
        garbage collector — a 1B model's 1.3 GB per run piled up over repeats, which then ran 2-4x slower."""
        if self.pool is not None:
            self.pool.close()
        if getattr(self, "ops", None) is not None:
            self.ops.steps.clear()

    def _abort_if_running(self, threads: list[threading.Thread]) -> None:
        """Make every worker return: after a deadlock or an interrupt of the driver (KeyboardInterrupt)."""
        with self.lock:
            done = self.dispatch.finished
        if not done:
            self._abort(None, RuntimeError("run interrupted"))
        self.go.set()


def run_plan(plan: Plan, packed_path: str | Path, tokens, *, spec: ModelSpec | None = None, evict: bool = True,
             isa: str | None = None) -> RunResult:
    """Run a bound cold-start plan on `packed_path` for the prompt `tokens` (prompt_tokens ints) and measure it.

    spec: the model's shapes (default: conf/model/<plan.model>.yaml). evict: drop the file from the page cache first
    (a cold start); resident_before records what remained. isa: force one native ISA (None: the fastest)."""
    path = Path(packed_path)
    ix = read_index(path)                             # for the checks below; read again, timed, after the eviction
    # the timed loads read byte ranges without their CRC32 (a CRC of every blob would be timed work a runtime does
    # not do): the whole file is CRC-checked once per version of it before any run (docs/hil.md "Faults and locks")
    verify_file(path)
    _check_bound(plan, ix)
    if spec is None:
        from quant.arch import model_spec

        spec = model_spec(plan.model)
    check_spec(ix, spec)
    toks = np.asarray(tokens, dtype=np.int64)
    if toks.ndim != 1 or toks.size != plan.prompt_tokens:
        raise ValueError(f"tokens: need {plan.prompt_tokens} token ids (plan prompt_tokens), got shape {toks.shape}")
    if toks.min() < 0 or toks.max() >= spec.vocab:
        raise ValueError(f"tokens: ids must be in 0..{spec.vocab - 1}")
    if isa is not None and isa not in native.COMPUTE_ISAS:
        raise ValueError(f"isa: unknown {isa!r} (one of {', '.join(native.COMPUTE_ISAS)})")
    if evict:
        resident = evict_cold(path)                    # evicted up to EVICT_TRIES times until nothing is cached
    else:
        resident = resident_fraction(path)
    # the set-up a runtime does before its first weight read is timed from the open (open_to_t0_s), so that a peer whose
    # clock includes its own load (hil.peer: llama.cpp's Llama()) is compared from the same point (docs/hil.md
    # "Comparing with a peer"): index read, compute buffers allocated and zero-filled, ops compiled, threads started
    t_open = time.perf_counter()
    ix = read_index(path)
    run = _Run(plan, ix, spec, toks, isa)             # every compute buffer allocated before t0
    try:
        switch, collecting = sys.getswitchinterval(), gc.isenabled()
        sys.setswitchinterval(SWITCH_INTERVAL_S)       # threads returning from a read or a native call get the GIL
        gc.disable()                                   # no cyclic garbage collection inside the timed run
        try:                                           # back quickly instead of waiting out a 5 ms time slice
            tl = run.run()
        finally:
            sys.setswitchinterval(switch)
            if collecting:
                gc.enable()
    finally:
        run.close()                                    # the native GEMM helpers stop on every exit path
    logits = run.rs.logits[0].copy()
    info = {"lazy_unpacked": len(run.ws.lazy_unpacked), "implicit_waits": run.implicit_waits, "faulted": run.faulted,
            "faulted_bytes": run.faulted_bytes, "isa": isa or "best", "staging_reused": run.ws.staging_reused,
            "open_to_t0_s": run.t0 - t_open,              # s from the file's open to t0 (measured; threads started)
            # for a scheduler trace of the run (hil.diagnostics.schedtrace): t0 (time.perf_counter; CLOCK_MONOTONIC on
            # Linux, the trace's "mono" clock) and the kernel ids of its threads (the caller's thread drove the run)
            "t0_perf_counter": run.t0, "thread_ids": {**run.thread_ids, threading.get_native_id(): "main"}}
    return RunResult(tl, logits, int(np.argmax(logits)), resident, info)
