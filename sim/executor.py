"""Executes a cold-start `Plan` in simulated time (`sim.engine`): the simulator side of the plan contract
(docs/design.md §3; EdgeFlow §4.3).

Resources: `Flash` (processor-shared bandwidth) behind `load` workers, `unpack` workers (one CPU thread each, on
cores 0..k-1), the CPU compute pool (`cpu`, one op at a time on `plan.cpu_threads` threads from
`plan.cpu_first_core`), the NPU (`npu`, one op at a time), the `graph` thread and zero-time `join` barriers.
Dispatch rules (shared with the HIL runner, EdgeFlow §4.3): a task enters its resource's ready queue when its last
dependency finishes. `static`: the CPU and the NPU each run their ops strictly in backbone order (`Task.order`) and
wait when the next one is not ready yet; `position`: a unit runs any ready op, earliest (chunk, layer, backbone
position) first. An idle CPU steals the NPU queue's head when more than `steal_threshold` NPU ops are ready.
Durations come from the
`CostModel`; flash reads from the flash model. Ties are broken by sequence numbers, so runs are deterministic.
A device is a `SocProfile` (what the hardware is); a measured host adds its `HostRuntime` (planner.host_runtime,
docs/design.md §6.1), the one hook through which the mechanics of its OS and of the Python runner below enter
(`runtime=`; None for a phone: every one of them off). Its fields are the `thread_wake_*`, `*_fault_*`, `read_*`
(except `read_cpu_gbps`), `flash_stream_start_s`, `flash_request_busy_s`, `flash_random_read_cpu_s`, the runner's
and the `corun_*` names below.
Contention (docs/coldstart.md "Shared resources"): every thread of the plan occupies a CPU core while it works — unpack
and compute ops, the CPU side of reads (page cache -> buffer at `read_cpu_gbps` plus first touch; for sequential reads
overlapping the flash transfer by `read_cpu_overlap` / `read_cpu_overlap_multi`, readahead keeps the device busy; after
it otherwise; x `read_cpu_multi` while another loader reads too, measured CPU per byte of two readers at once;
bytes the kernel read ahead while the device was idle come from the page cache, `read_ahead_bytes`;
a loader that starts a new sequential stream waits `flash_stream_start_s` first),
copies, deserialization and graph restore (which also holds one of `npu_driver_slots` NPU driver slots), a runtime's
fixed costs per loaded / unpacked tensor (`load_tensor_s`, `unpack_tensor_s`: buffer set-up, calls, bookkeeping; an
unpack runs as `OpWork.calls` kernel calls, one per packed tensor, each returning to the interpreter lock; with
`interpreter_lock`, these and each op's dispatch cost run under one process-wide mutex, a Python runtime's GIL, held
until they have had their core time; finding it held, or returning from a kernel or a read into it held, costs a
blocking hand-off's `thread_wake_cpu_s`) — and the cores are processor-shared (`sim.sharing.Cores`): with more runnable
threads than cores every op slows down. The NPU queue occupies a core only where it is one (`npu_on_cpu_core`, this
host's NPU stand-in). Newly allocated memory (a load's buffer and NPU-buffer copy, an unpack's INT8 output) costs its
allocating thread first-touch time (`HostRuntime.fault_s_per_byte`: page faults + zeroing; a read() into a fresh buffer
faults it in inside the kernel's copy, `read_fault_s_per_byte`; an unpack kernel's stores into its fresh output,
`unpack_fault_s_per_byte`); threads fault in parallel (measured on the host,
docs/hil.md). Fresh memory follows the runner's allocations: unpacked tensors and non-staging blobs are new, staging
blobs (packed tensors an unpack consumes) reuse buffers released by earlier unpacks, best fit (unbound plans: only
memory beyond the run's high-water mark is fresh). A worker that waited idle starts `thread_wake_s` after being woken (a
thread hand-off; `thread_wake_busy_s` while other threads occupy every core, `thread_wake_idle_core_s` while some
run and a core is idle: it starts there) and spends `thread_wake_cpu_s` of core time
on the wake-up itself. A guest kernel may instead put a thread woken while its waker runs on the waker's busy core
(`thread_wake_pack_idle_s`, `thread_wake_pack_share`, measured on the host; docs/hil.md "Wake-up packing"): the pair
shares the waker's core, the woken thread first, until its task ends, it blocks, or the next balance tick
(`sched_balance_s`), while another core may idle (`Cores.pack`). A runtime that splits only GEMMs over its CPU threads
(`cpu_split_gemm_only`, the host runner) runs its other ops on the worker's one core; a multi-threaded GEMM's helpers
poll their cores for `gemm_pool_spin_s` after it (occupied cores; the next GEMM in that window finds them awake) and are
woken otherwise (`gemm_pool_wake_s` later). DRAM bandwidth (`dram_gbps`) is one shared resource for copies, reads'
page-cache copies, unpack writes, CPU GEMM operands and NPU weight reads (`CostModel.dram_bytes`).
Memory: `mem_alloc` at task start, `mem_free` at task end, peak tracked. `preloaded_bytes` of layer weights (in load
order) are already resident (EdgeFlow Fig. 2's prefetching): their loads skip the flash read but keep copy/deserialize.
"""
from __future__ import annotations

import bisect
import gc
import math

from planner.cost.base import CostModel
from planner.device import SocProfile
from planner.host_runtime import MEMORY_CLASSES, NO_RUNTIME, HostRuntime
from planner.pipeline.dispatch import QUEUED, Dispatcher
from planner.plan import OpWork, Plan
from planner.timeline import Span, Timeline
from sim.engine import AllDone, Environment, Event, Resource
from sim.flash import Flash
from sim.sharing import NO_SLOW, Cores, SharedRate

# class of work of each op kind, for the co-run slowdown (HostRuntime.corun_*)
KIND_CLASS = {"matmul": "gemm", "lm_head": "gemm", "attention": "elementwise", "elementwise": "elementwise",
              "unpack": "unpack"}
GEMM_KINDS = ("matmul", "lm_head")     # the op kinds a runtime splits over its GEMM pool
FRESH_USERS = ("load", "unpack")       # the resources whose tasks' cost depends on their fresh memory (first touch)


RA_GAP_BYTES = 128 << 10   # B, ranges this close count as one sequential stream (the kernel's default readahead window)


def _stream_extent(t) -> tuple[int, int]:
    """[lo, hi) of the file bytes a load streams: its tensor ranges joined where less than RA_GAP_BYTES apart, the
    group with the most bytes (a layer's weights; its norm vectors sit with every other layer's at the file's end)."""
    groups: list[list[int]] = []                       # [lo, hi, bytes]
    for a, b in sorted((r.offset, r.offset + r.nbytes) for r in t.tensors):
        if groups and a - groups[-1][1] <= RA_GAP_BYTES:
            groups[-1][1] = max(groups[-1][1], b)
            groups[-1][2] += b - a
        else:
            groups.append([a, b, b - a])
    lo, hi, _ = max(groups, key=lambda g: g[2])
    return lo, hi


class PlanExecutor:
    def __init__(self, plan: Plan, dev: SocProfile, cost: CostModel, preloaded_bytes: int = 0,
                 runtime: HostRuntime | None = None) -> None:
        self.plan, self.dev, self.cost = plan, dev, cost
        # the host's runtime mechanics (planner.host_runtime); None: a device without them, every phone profile
        self.rt = rt = NO_RUNTIME if runtime is None else runtime
        self.preloaded = int(preloaded_bytes)   # B of weights already in memory (Fig. 2): served without flash reads
        self.env = Environment()
        # cores' and DRAM's rate samples are read by nobody (the flash's are: the timeline, readahead)
        self.cores = Cores(self.env, dev.cpu_cores, record=False)
        self.flash = Flash(self.env, dev, self.cores, rt.flash_request_busy_s)
        self.driver = Resource(self.env, capacity=max(1, dev.npu_driver_slots))
        self.dram = SharedRate(self.env, dev.dram_gbps * 1e9, record=False) if dev.dram_gbps > 0 else None
        # a Python runtime's interpreter lock: its per-task code runs one thread at a time (rt.interpreter_lock)
        self.gil = Resource(self.env, capacity=1) if rt.interpreter_lock else None
        # x CPU time per class of work while other threads use the other cores: beside compute, beside memory-system
        # work (HostRuntime.corun_*, measured)
        self.dispatch = Dispatcher(plan)
        self.n_tasks = len(plan.tasks)
        self.idle: dict[str, list[Event]] = {r: [] for r in QUEUED}
        self.all_done = self.env.event()
        self.spans: list[Span] = []
        self.mem = 0
        self.peak_mem = 0
        # the runner's staging pool (hil.runner_state.WeightStore.blob): the blobs an unpack task consumes are staging
        # buffers, released once unpacked and taken best fit by later loads (no fresh memory); other blobs and the
        # unpacked INT8 tensors are fresh memory
        self.staged = {r.name for t in plan.tasks if t.resource == "unpack" for r in t.tensors}
        self.pool: list[int] = []             # B, sizes of free staging buffers, sorted
        self.mem_samples: list[tuple[float, int]] = [(0.0, 0)]
        self.gil_waits = 0                    # runtime parts that found the interpreter lock held (hand-offs)
        self.idle_wakes = 0                   # idle workers woken for a task
        self.waits_by: dict[str, int] = {}     # worker ("cpu0", "load1", ...) -> its blocking waits (both kinds above)
        self.reading = 0                      # sequential loads in their device transfer now
        self.loading = 0                      # sequential loads under way (set-up, transfer or CPU side)
        # per loader thread (its own file descriptor, as the runner's: its own readahead state): (end of the file
        # range its last sequential load streamed, when that read call returned)
        self.ra: dict[object, tuple[int, float]] = {}
        self.stream_end: dict[object, int] = {}      # loader thread -> end of the file range its stream reached
        self.pool_spin: dict = {}             # worker -> core job of its GEMM helpers polling after the last GEMM
        self.pool_wakes = 0                   # multi-threaded GEMMs whose helpers had to be woken
        self.packed_wakes = 0                 # wake-ups put on the waker's busy core (HostRuntime.thread_wake_pack_*)
        self.gil_last: object = None          # the thread that last took the interpreter lock (a hand-off's waker)
        self.sleeping: set = set()            # workers asleep waiting for a task
        self.pack_acc = 0.0                   # accumulated share of packable wake-ups (`_packs`)
        self._corun: dict[str, tuple[float, float]] = {}   # class of work -> rt.corun(class), looked up once

    # ---- dispatch (rules in planner.pipeline.dispatch, shared with the HIL runner) --------------------------------
    def _wake(self, resources: list[str], waker: object = None) -> None:
        for r in resources:
            if self.idle[r]:
                self.idle[r].pop(0).succeed(waker)

    def _mem(self, delta: int) -> None:
        if delta:
            self.mem += delta
            if self.mem > self.peak_mem:
                self.peak_mem = self.mem
            self.mem_samples.append((self.env.now, self.mem))

    def _read_done(self, t_end: list[float]) -> None:
        self.reading -= 1
        t_end[0] = self.env.now

    def _read_ahead(self, t, nread: int, owner: object) -> tuple[int, int]:
        """(bytes of a sequential load already in the page cache, the end of its file range). The kernel's readahead
        (`read_ahead_bytes`), per loader thread (each streams through its own descriptor): while the device had
        nothing else to do since that thread's last read call returned (it then copies, waits for compute, ...), the
        kernel read on past the end of its stream, up to the window — bytes another loader read in between (the
        layers in between) count against the window. During a read call the readahead is `read_cpu_overlap`'s share
        (fitted to the calibration's continuous read), so it is not credited twice.
        Only for loads bound to file ranges (the runner's file). The stream is the load's main extent
        (`_stream_extent`): a layer's float32 norm vectors, stored together elsewhere in the file, are small reads
        beside it and do not move the stream."""
        if self.rt.read_ahead_bytes <= 0 or t.random_reads or not t.tensors or any(r.nbytes <= 0 for r in t.tensors):
            return 0, 0
        lo, hi = _stream_extent(t)
        base, t_end = self.ra.get(owner, (-1, 0.0))
        if base < 0 or lo < base:
            return 0, hi
        frontier = base + min(self.rt.read_ahead_bytes, int(self.flash.idle_since(t_end)))
        return min(nread, max(0, min(hi, frontier) - lo)), hi

    def _starts_stream(self, t, owner: object) -> bool:
        """Whether sequential load `t` starts a new stream of its loader thread, which waits `flash_stream_start_s`
        before its transfer (the first request is read synchronously and the kernel's readahead window ramps up;
        measured on the host, docs/hil.md "Loads"): the thread's first sequential read of the run or, bound to file
        ranges, one that starts before the end of its last stream. A forward skip continues the stream, as in
        `_read_ahead` (the bytes in between are another loader's)."""
        if self.rt.flash_stream_start_s <= 0 or t.random_reads or t.read_bytes <= 0:
            return False
        bound = bool(t.tensors) and all(r.nbytes > 0 for r in t.tensors)
        lo, hi = _stream_extent(t) if bound else (0, 0)
        end = self.stream_end.get(owner)
        new = end is None or lo < end
        self.stream_end[owner] = hi if new else max(hi, end)
        return new

    def _after(self, wake: list[str], joins: list[int], waker: object = None) -> None:
        for j in joins:
            self._mem(-self.plan.tasks[j].mem_free)
        if wake:
            self._wake(wake, waker)
        if self.dispatch.done == self.n_tasks and not self.all_done.triggered:     # dispatch.finished, inline
            self.all_done.succeed()

    def _occupy(self, seconds: float, threads: int, dram_bytes: float, on_core: bool = True, owner: object = None,
                cls: str = "") -> list[Event]:
        """Events of one op's shared resources: its threads' core time and, where modelled, its DRAM traffic (demand
        rate = bytes / isolated time, so alone it ends exactly at `seconds`; with others it is slowed when the demands
        exceed `dram_gbps`)."""
        if on_core:
            slow = self._corun.get(cls)
            if slow is None:
                slow = self._corun[cls] = self.rt.corun(cls)
            evs = [self.cores.run(seconds, threads, owner, slow, cls in MEMORY_CLASSES)]
        else:
            evs = [self.env.timeout(seconds)]
        if self.dram is not None and dram_bytes > 0:
            evs.append(self.dram.use(dram_bytes, cap=dram_bytes / seconds))
        return evs

    def _occupied(self, seconds: float, threads: int, dram_bytes: float, on_core: bool = True, owner: object = None,
                  cls: str = "") -> AllDone:
        """`AllDone` of `_occupy`'s events, scheduled the same; on a core its jobs are the barrier's parts (no event
        per job: sim.engine.AllDone)."""
        if not on_core:
            return AllDone(self.env, self._occupy(seconds, threads, dram_bytes, on_core, owner, cls))
        dram = self.dram is not None and dram_bytes > 0.0
        done = AllDone(self.env, (), 2 if dram else 1)
        slow = self._corun.get(cls)
        if slow is None:
            slow = self._corun[cls] = self.rt.corun(cls)
            if slow[0] < 1.0 or slow[1] < 1.0:           # Cores.run's check, once per class of work
                raise ValueError(f"cores job: slow factors must be >= 1 (got {slow})")
        th = float(threads)                              # Cores.run, inline
        self.cores.use(seconds * threads, th, th, owner, slow, cls in MEMORY_CLASSES, False, done)
        if dram:
            self.dram.use(dram_bytes, dram_bytes / seconds, 1.0, None, NO_SLOW, False, False, done)
        return done

    def _runtime(self, seconds: float, owner: object = None) -> AllDone:
        """The runtime's own per-task code (dispatch, buffer set-up, bookkeeping) on one thread, done: core time and,
        with an interpreter lock, under that lock (`_locked`)."""
        if self.gil is None:
            return self._occupied(seconds, 1, 0.0, owner=owner, cls="runtime")
        return AllDone(self.env, [self.env.process(self._locked(seconds, owner, handoff=False))])

    def _locked(self, seconds: float, owner: object, handoff: bool):
        """A Python runtime's code under its interpreter lock: a mutex (FIFO), held until the code has had its core
        time — a holder that waits for a core keeps the lock meanwhile, as a preempted thread keeps the GIL. A thread
        that finds the lock held blocks and is handed it later: that costs it a wake-up's CPU (`thread_wake_cpu_s`,
        measured for the same futex hand-off through a Condition) and its latency (`thread_wake_s`, the same
        measurement; the lock stays reserved for it, as CPython's forced switch waits until the waiter took it). The
        measured runs block more often than this models (docs/hil.md "Limits")."""
        held = self._gil_held()
        if held or handoff:
            self.cores.unpack(owner)                        # it blocks: a packed thread is free again
        with self.gil.request() as lock:
            yield lock
            if held or handoff:
                self.gil_waits += 1
                self._count_wait(owner)
                seconds += self.rt.thread_wake_cpu_s
                if self.rt.thread_wake_s > 0:       # woken like any futex waiter: it runs thread_wake_s later,
                    yield self.env.timeout(self.rt.thread_wake_s)   # the lock reserved for it meanwhile
                self._maybe_pack(owner, self.gil_last)      # ... maybe on its waker's busy core
            self.gil_last = owner
            if seconds > 0:
                yield self._occupied(seconds, 1, 0.0, owner=owner, cls="runtime")

    def _count_wait(self, owner: object) -> None:
        """Tally one blocking wait of worker `owner` ((resource, idx); anonymous owners are not a worker)."""
        if isinstance(owner, tuple) and len(owner) == 2 and isinstance(owner[0], str):
            name = f"{owner[0]}{owner[1]}"
            self.waits_by[name] = self.waits_by.get(name, 0) + 1

    def _gil_held(self) -> bool:
        return self.gil is not None and (self.gil.count > 0 or len(self.gil.queue) > 0)

    def _retake(self, owner: object):
        """After a native call (a kernel, a read) a Python runtime's thread re-takes its interpreter lock: free, at no
        cost; held by another thread, a blocking hand-off (`_locked`). Yields until done; returns the core seconds."""
        if self.gil is None or not self._gil_held() or self.rt.thread_wake_cpu_s <= 0:
            return 0.0
        yield self.env.process(self._locked(0.0, owner, handoff=True))
        return self.rt.thread_wake_cpu_s

    def _pool_start(self, owner: object) -> float:
        """A multi-threaded GEMM of worker `owner` starts: helpers still polling after its last GEMM take it at once
        (their polling ends); sleeping ones are woken, which delays the GEMM by `gemm_pool_wake_s` (returned)."""
        spin = self.pool_spin.pop(owner, None)
        if spin is not None and self.cores.cancel(spin):
            return 0.0
        self.pool_wakes += 1
        return self.rt.gemm_pool_wake_s

    def _pool_end(self, owner: object, threads: int) -> None:
        """After the GEMM its `threads - 1` helpers keep polling their cores for `gemm_pool_spin_s` (core time that
        slows nobody through co-running, but takes a core share) unless the next GEMM cancels it first."""
        if self.rt.gemm_pool_spin_s > 0:
            self.pool_spin[owner] = self.cores.run(self.rt.gemm_pool_spin_s, threads - 1, ("pool", owner), NO_SLOW,
                                                   False, True)            # neutral

    def _python_s(self, w: OpWork, unit: str) -> float:
        """Seconds of op `w` that run under the interpreter lock: the cost model's per-op dispatch overhead, at
        least `cpu_op_python_s` for a compute op (measured on the host: the runner's loop between two ops, ~4 us,
        where the cost table's overhead is ~1 us because its kernel points include ~5 us of a checked wrapper's
        Python — the same total per op, a different share held under the lock)."""
        over = self.cost.overhead_time(w, unit)
        return max(over, self.rt.cpu_op_python_s) if over > 0 else over

    def _touch_s(self, nbytes: int, allocations: int = 1, unpack: bool = False) -> float:
        """Core seconds of first-touching `nbytes` of newly allocated memory in `allocations` equal buffers, alone
        (`HostRuntime.fault_s_per_byte`: large allocations fault for less per byte, measured); `unpack`: by an
        unpack kernel writing its outputs (`unpack_fault_s_per_byte`, measured apart: the writer matters)."""
        if nbytes <= 0:
            return 0.0
        per = self.rt.unpack_fault_s_per_byte if unpack else self.rt.fault_s_per_byte
        return nbytes * per(nbytes / max(1, allocations))

    def _cpu_with_touch(self, cpu_s: float, touch_bytes: int, dram_bytes: float, allocations: int = 1,
                        owner: object = None) -> AllDone:
        """Events of a thread's CPU work of `cpu_s` (isolated) that first-touches `touch_bytes` of fresh memory: both
        are core time of that thread. Page faults of different threads do not serialize here (measured on the host:
        two threads touching or reading into fresh buffers each spend the CPU per byte of one alone, docs/hil.md)."""
        core_s = cpu_s + self._touch_s(touch_bytes, allocations)
        return self._occupied(core_s, 1, dram_bytes, owner=owner, cls="touch") if core_s > 0 else AllDone(self.env)

    def _fresh_bytes(self, t) -> int:
        """Bytes of task `t`'s allocation that are fresh memory (first touch). A task bound to file tensors: an
        unpack's outputs are new tensors; a load's staging blobs come from the pool when a free buffer holds them
        (best fit, as the runner), its other blobs are new. Unbound plans: memory freed earlier is reused (an
        allocator's free lists), so only the part beyond the run's high-water mark is fresh."""
        if t.tensors and all(r.nbytes > 0 for r in t.tensors):
            if t.resource == "unpack":
                return t.mem_alloc
            if t.resource == "load" and t.mem_alloc > 0:
                fresh = 0
                for r in t.tensors:
                    i = bisect.bisect_left(self.pool, r.nbytes) if r.name in self.staged else len(self.pool)
                    if i < len(self.pool):
                        self.pool.pop(i)
                    else:
                        fresh += r.nbytes
                return min(fresh, t.mem_alloc)
        return max(0, min(t.mem_alloc, self.mem + t.mem_alloc - self.peak_mem))

    # ---- workers -----------------------------------------------------------------------------------------------
    def _worker(self, resource: str, idx: int):
        """One worker thread of `resource`: takes the next ready task (the shared dispatch rules), runs it on its
        shared resources, records its span; with nothing ready it sleeps until woken (`_sleep`)."""
        env = self.env
        me = (resource, idx)
        while True:
            got = self.dispatch.pop(resource)
            if got is None:
                yield from self._sleep(resource, idx)
                continue
            tid, stolen, wake = got
            if wake:
                self._wake(wake, me)
            t = self.plan.tasks[tid]
            start = env.now
            fresh = self._fresh_bytes(t) if resource in FRESH_USERS else 0    # (pure for the other resources)
            if t.mem_alloc:
                self._mem(t.mem_alloc)
            if resource == "load":
                unit, cpu_s = "io", (yield from self._load(t, fresh, me))
            elif resource == "graph":
                unit, cpu_s = "graph", 0.0
                start = yield from self._graph(t, start)
            elif resource == "unpack":
                unit, cpu_s = "cpu", (yield from self._unpack(t, fresh, me))
            else:
                unit, cpu_s = yield from self._compute(t, resource, stolen, me)
            self._end(t, tid, stolen, resource, idx, start, unit, cpu_s)

    def _sleep(self, resource: str, idx: int):
        """An idle worker waits on its resource's queue; once woken it starts `thread_wake_s` later (a thread
        hand-off; `thread_wake_busy_s` while other threads occupy every core, `thread_wake_idle_core_s` while some
        run and a core is idle: it starts there) and spends `thread_wake_cpu_s` of core time on the wake-up."""
        env, rt, me = self.env, self.rt, (resource, idx)
        if self.cores.packs:
            self.cores.unpack(me)
        ev = env.event()
        self.idle[resource].append(ev)
        self.sleeping.add(me)
        waker = yield ev
        self.sleeping.discard(me)
        self.idle_wakes += 1
        self._count_wait(me)
        wake_s = rt.thread_wake_s          # an idle worker thread takes this long to run once woken
        if rt.thread_wake_busy_s > 0 or rt.thread_wake_idle_core_s > 0 or rt.thread_wake_pack_share > 0:
            yield env.timeout(0)                # the waker and others woken at this instant start first
            if rt.thread_wake_busy_s > 0 and self.cores.full_without():
                wake_s = rt.thread_wake_busy_s     # ... longer while other threads occupy every core
            elif self._maybe_pack(me, waker):
                wake_s = rt.thread_wake_s          # ... put on its waker's busy core, which it preempts at once
            elif rt.thread_wake_idle_core_s > 0 and self.cores.active:
                wake_s = rt.thread_wake_idle_core_s    # ... on an idle core while others keep running
        if wake_s > 0:
            yield env.timeout(wake_s)
        if self.rt.thread_wake_cpu_s > 0:              # the wake-up's own CPU work (futex, locks)
            yield self._runtime(self.rt.thread_wake_cpu_s, owner=(resource, idx))

    def _packs(self, waker: object) -> bool:
        """Whether the OS puts a thread woken now by `waker` (running, another core idle) on the waker's core: once
        the idle core has been idle `thread_wake_pack_idle_s`, a `thread_wake_pack_share` of such wake-ups are
        (deterministic: an accumulator of that share packs every time it reaches one)."""
        rt = self.rt
        if waker is None or rt.thread_wake_pack_share <= 0 or rt.thread_wake_pack_idle_s <= 0:
            return False
        if waker in self.sleeping:                          # it went to sleep: nothing keeps its core busy
            return False
        idle = self.cores.idle_for()
        if idle is None or idle < rt.thread_wake_pack_idle_s:
            return False
        self.pack_acc += rt.thread_wake_pack_share
        if self.pack_acc < 1.0 - 1e-9:
            return False
        self.pack_acc -= 1.0
        return True

    def _maybe_pack(self, wakee: object, waker: object) -> bool:
        """Thread `wakee`, just woken by `waker`: put it on the waker's core if the OS would (`_packs`), until its
        task ends, it blocks, or the next balance tick (`sched_balance_s`) splits the pair."""
        if waker is None or waker == wakee or not self._packs(waker):
            return False
        self.cores.pack(wakee, waker)
        self.packed_wakes += 1
        tick = self.rt.sched_balance_s
        if tick > 0:
            self.env.process(self._balance(wakee, waker, (math.floor(self.env.now / tick) + 1) * tick - self.env.now))
        return True

    def _balance(self, wakee: object, waker: object, after_s: float):
        """The kernel's balance tick: a pair still packed then is split (one of them moves to the idle core)."""
        yield self.env.timeout(after_s)
        if self.cores.packs.get(wakee) == waker:
            self.cores.unpack(wakee)

    def _load(self, t, fresh: int, me: tuple[str, int]):
        """A load task on loader thread `me`: the runtime's per-tensor set-up, the flash transfer with the CPU side of
        the read (module doc), the re-take of the interpreter lock, the copy into a fresh NPU buffer and the task's
        own CPU work (deserialization). Yields until done; returns the core seconds."""
        dev, rt = self.dev, self.rt
        hit = min(self.preloaded, t.read_bytes) if t.layer >= 0 else 0
        self.preloaded -= hit
        nread = t.read_bytes - hit
        # CPU side of the read: the syscall's page-cache work and copy into the user buffer (read_cpu_gbps),
        # faulting in the freshly allocated buffer (read_fault_gbps); it occupies a core either way. A sequential
        # read overlaps part of it with the device transfer — the kernel's asynchronous readahead keeps the device
        # streaming the next pages while the thread copies and faults in the current ones — by the measured share
        # `read_cpu_overlap` (docs/hil.md "Loads"); scattered reads (no readahead) pay transfer, then copy.
        read_cpu = nread / (dev.read_cpu_gbps * 1e9) if dev.read_cpu_gbps > 0 else 0.0
        if t.random_reads and rt.flash_random_read_cpu_s > 0 and nread > 0:
            # scattered reads: each request's own kernel work (a page each, measured per request)
            read_cpu = -(-nread // max(1, t.request_bytes)) * rt.flash_random_read_cpu_s
        n_buf = max(1, len(t.tensors))                        # one buffer per tensor (the runner's blobs)
        if fresh > 0:        # the read faults the fresh buffer in inside the kernel's copy (read_fault_gbps)
            read_cpu += fresh * rt.read_fault_s_per_byte(fresh / n_buf)
        setup = len(t.tensors) * rt.load_tensor_s if t.ops != ["embed"] else 0.0
        sequential = nread > 0 and not t.random_reads
        self.loading += sequential
        try:
            cpu_s = yield from self._load_read(t, nread, read_cpu, setup, n_buf, sequential, me)
        finally:
            self.loading -= sequential
        return cpu_s

    def _load_read(self, t, nread: int, read_cpu: float, setup: float, n_buf: int, sequential: bool,
                   me: tuple[str, int]):
        """_load's set-up, transfer, CPU side and copy (module doc); returns the core seconds."""
        env, rt = self.env, self.rt
        cpu_s = 0.0
        if setup > 0:      # per tensor: the buffer, the read call, the bookkeeping (the runner's, measured)
            cpu_s += setup
            yield self._runtime(setup, owner=me)
        if sequential and rt.read_cpu_multi != 1.0:
            yield env.timeout(0)               # every load that starts at this instant has registered
            if self.loading > 1:
                read_cpu *= rt.read_cpu_multi     # another loader reads too: more CPU per byte (read_cpu_multi)
        if nread > 0 and self._starts_stream(t, me):     # a new sequential stream: its start-up latency
            yield env.timeout(rt.flash_stream_start_s)
        ahead, hi = self._read_ahead(t, nread, me)     # already in the page cache: copied, not transferred
        if nread - ahead > 0:
            self.cores.unpack(me)                      # it blocks on the device: a packed loader is free again
        transfer = self.flash.read(nread - ahead, t.request_bytes, t.random_reads, owner=me)
        t_start, t_end = env.now, [env.now]
        if not t.random_reads:
            self.reading += 1                 # sequential readers in their transfer right now
            transfer.callbacks.append(lambda _e: self._read_done(t_end))
        if rt.read_irq_gbps > 0 and nread > 0:
            # the read's interrupt and block-completion work takes core time meanwhile (charged to whichever thread
            # runs; nobody waits for it)
            self.cores.run(nread / (rt.read_irq_gbps * 1e9), 1, me)
        # the overlap measured with as many readers as are streaming now (one, or several at once)
        eta = 0.0 if t.random_reads else rt.read_overlap(self.reading)
        if read_cpu > 0 and eta > 0:
            # max(T, C) + (1 − η)·min(T, C): both run, then the part that did not overlap; T = this read's transfer
            # as it went (the device shared with the other readers, as in the calibration)
            yield AllDone(env, [transfer, *self._occupy(read_cpu, 1, 2.0 * nread, owner=me, cls="read")])
            exposed = (1.0 - eta) * min(t_end[0] - t_start, read_cpu)
            if exposed > 0:
                yield env.timeout(exposed)
        else:
            yield transfer
            if read_cpu > 0:
                yield self._occupied(read_cpu, 1, 2.0 * nread, owner=me, cls="read")
        if hi > 0:      # the read call returned: from now on the kernel reads ahead of this stream alone
            self.ra[me] = (hi, env.now)    # (its readahead during the call is read_cpu_overlap's part)
        if nread > 0:                                           # the read returns: re-take the lock
            cpu_s += yield from self._retake(me)
        copy_c = self.cost.copy_time(t.copy_bytes)                     # into a fresh NPU buffer
        copy_s = copy_c + self._touch_s(t.copy_bytes, n_buf)
        cpu_s += read_cpu + copy_s + t.duration_s
        if copy_s > 0:
            yield self._cpu_with_touch(copy_c, t.copy_bytes, 2.0 * t.copy_bytes, n_buf, me)
        if t.duration_s > 0:
            yield self.cores.run(t.duration_s)
        return cpu_s

    def _graph(self, t, start: float):
        """A graph-restore task: CPU/driver work holding one of the `npu_driver_slots` (NPU driver work is
        serialized). Yields until done; returns the span's start (waiting for the driver is not restore work)."""
        if t.duration_s > 0:
            with self.driver.request() as slot:
                yield slot
                start = self.env.now
                yield self.cores.run(t.duration_s)
        return start

    def _compute(self, t, resource: str, stolen: bool, me: tuple[str, int]):
        """A compute task on the CPU pool (its `plan.cpu_threads` threads; also an NPU op the CPU stole) or on the NPU
        queue, op by op: the runtime's dispatch under the interpreter lock, a multi-threaded GEMM's helpers (polling
        or woken), the op's core time and DRAM traffic, the lock re-take as the kernel returns. Yields until done;
        returns (unit, core seconds)."""
        env, plan, cost = self.env, self.plan, self.cost
        if resource == "cpu" or stolen:
            unit, threads, core = "cpu", plan.cpu_threads, plan.cpu_first_core
        else:
            unit, threads, core = "npu", 1, 0
        cpu_s = 0.0
        on_core = unit == "cpu" or self.rt.npu_on_cpu_core
        locked = self.gil is not None and on_core
        split_gemm_only = self.rt.cpu_split_gemm_only
        spin_s, wake_s = self.rt.gemm_pool_spin_s, self.rt.gemm_pool_wake_s
        for w in t.works:
            dur = cost.op_time(w, unit, threads, core)
            py = min(dur, self._python_s(w, unit)) if locked else 0.0
            if py > 0.0:                                      # the runtime's dispatch of the op
                cpu_s += py
                yield self._runtime(py, owner=me)
            kind = w.kind
            gemm = kind in GEMM_KINDS
            occ = threads if gemm or not split_gemm_only else 1   # threads the op occupies
            pooled = gemm and threads > 1 and unit == "cpu"
            if pooled:                               # the GEMM's helpers: polling still, or woken now
                if self.pool_spin:
                    wake = self._pool_start(me)
                else:                                # _pool_start with no helpers polling, inline
                    self.pool_wakes += 1
                    wake = wake_s
                if wake > 0.0:
                    yield env.timeout(wake)
            if dur - py > 0.0:
                cpu_s += (dur - py) * occ if on_core else 0.0
                yield self._occupied(dur - py, occ, cost.dram_bytes(w, unit), on_core, me, KIND_CLASS.get(kind, ""))
            if pooled and spin_s > 0:
                self._pool_end(me, threads)
            if dur - py > 0.0 and locked:             # the kernel returns: re-take the lock
                cpu_s += yield from self._retake(me)
        return unit, cpu_s

    def _end(self, t, tid: int, stolen: bool, resource: str, idx: int, start: float, unit: str, cpu_s: float) -> None:
        """Record task `t`'s span, release its memory (an unpack's staging buffers go to the pool) and complete it."""
        self.spans.append(Span(tid, "cpu" if stolen else resource, idx, start, self.env.now, unit, stolen, cpu_s))
        if resource == "unpack":
            for r in t.tensors:
                if r.nbytes > 0:
                    bisect.insort(self.pool, r.nbytes)
        if t.mem_free:
            self._mem(-t.mem_free)
        if self.cores.packs:                                 # its task ended: a packed thread is free again
            self.cores.unpack((resource, idx))
        wake, joins = self.dispatch.complete(tid)
        if joins or wake or self.dispatch.done == self.n_tasks:
            self._after(wake, joins, (resource, idx))

    def _unpack(self, t, fresh: int, me: tuple[str, int]):
        """An unpack task on one thread, as the runner does it: per packed tensor (`OpWork.calls` kernel calls per
        work, its tensors' share each) the runtime's set-up (`unpack_tensor_s` per tensor of the task, under the
        interpreter lock), the kernel's first touch of its fresh INT8 output and its unpack work, then the re-take of
        the interpreter lock as the call returns (a blocking hand-off when another thread holds it). Yields until done;
        returns the core seconds."""
        cost = self.cost
        cpu_s = 0.0
        setup = len(t.tensors) * self.rt.unpack_tensor_s
        n_out = max(1, len(t.tensors))
        touch = self._touch_s(fresh, n_out, unpack=True)              # the fresh INT8 outputs
        calls = [(w, max(1, w.calls)) for w in t.works]
        n_calls = sum(n for _w, n in calls) or 1
        for w, n in calls:
            dur = cost.op_time(w, "cpu", 1, me[1])
            py = min(dur, self._python_s(w, "cpu")) if self.gil is not None else 0.0
            dram = cost.dram_bytes(w, "cpu")
            for _ in range(n):
                run = setup / n_calls + py / n                         # set-up + the call's own Python
                if run > 0:
                    cpu_s += run
                    yield self._runtime(run, owner=me)
                if touch > 0:
                    cpu_s += touch / n_calls
                    yield self._occupied(touch / n_calls, 1, 0.0, owner=me, cls="touch")
                if dur - py > 0:
                    cpu_s += (dur - py) / n
                    yield self._occupied((dur - py) / n, 1, dram / n, owner=me, cls=KIND_CLASS.get(w.kind, ""))
                if touch > 0 or dur - py > 0:
                    cpu_s += yield from self._retake(me)              # the kernel returns: re-take the lock
        return cpu_s

    def run(self) -> Timeline:
        env = self.env
        for r in QUEUED:
            for i in range(self.plan.workers(r)):
                env.process(self._worker(r, i))
        self._after(*self.dispatch.start())
        if self.plan.tasks:
            try:
                env.run(until=self.all_done)
            except RuntimeError:        # no events left before all_done -> reported below
                pass
        if not self.dispatch.finished:
            raise RuntimeError(f"plan deadlocked: {self.dispatch.done}/{len(self.plan.tasks)} tasks ran")
        return Timeline(self.plan, self.spans, env.now, self.flash.bytes_read, self.peak_mem, self.flash.samples,
                        self.mem_samples, core_busy_s=self.cores.busy_core_s(),
                        waits=self.idle_wakes + self.gil_waits, waits_by_thread=dict(sorted(self.waits_by.items())),
                        packed_wakes=self.packed_wakes)


def simulate(plan: Plan, dev: SocProfile, cost: CostModel, preloaded_bytes: int = 0,
             runtime: HostRuntime | None = None) -> Timeline:
    """The timeline of `plan` on device `dev` (durations from `cost`); `runtime`: the host's runtime mechanics
    (a measured host, `planner.host_runtime`), None for a device without them."""
    # a simulation allocates many objects (per-task state, events, spans) and frees them by reference counting: the
    # cyclic collector would only re-traverse the plan meanwhile (paused, as `timeit` does; restored on every exit path)
    collecting = gc.isenabled()
    gc.disable()
    try:
        return PlanExecutor(plan, dev, cost, preloaded_bytes, runtime).run()
    finally:
        if collecting:
            gc.enable()
