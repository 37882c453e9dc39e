"""Executes a cold-start `Plan` in simulated time (SimPy): the simulator side of the plan contract
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
Contention (docs/coldstart.md "Shared resources"): every thread of the plan occupies a CPU core while it works —
unpack and compute ops, the CPU side of reads (page cache -> buffer at `read_cpu_gbps`, after the flash transfer),
copies, deserialization and graph restore (which also holds one of `npu_driver_slots` NPU driver slots) — and the cores
are processor-shared (`sim.sharing.Cores`): with more runnable threads than cores every op slows down. The NPU queue
occupies a core only where it is one (`npu_on_cpu_core`, this host's NPU stand-in). Newly
allocated memory (a load's buffer and NPU-buffer copy, an unpack's INT8 output) costs its allocating thread first-touch
time (`mem_fault_gbps`: page faults + zeroing). DRAM bandwidth (`dram_gbps`) is one shared resource for copies, reads'
page-cache copies, unpack writes, CPU GEMM operands and NPU weight reads (`CostModel.dram_bytes`).
Memory: `mem_alloc` at task start, `mem_free` at task end, peak tracked. `preloaded_bytes` of layer weights (in load
order) are already resident (EdgeFlow Fig. 2's prefetching): their loads skip the flash read but keep copy/deserialize.
"""
from __future__ import annotations

import simpy

from planner.cost.base import CostModel
from planner.device import SocProfile
from planner.pipeline.dispatch import QUEUED, Dispatcher
from planner.plan import Plan
from planner.timeline import Span, Timeline
from sim.flash import Flash
from sim.sharing import Cores, SharedRate


class PlanExecutor:
    def __init__(self, plan: Plan, dev: SocProfile, cost: CostModel, preloaded_bytes: int = 0) -> None:
        self.plan, self.dev, self.cost = plan, dev, cost
        self.preloaded = int(preloaded_bytes)   # B of weights already in memory (Fig. 2): served without flash reads
        self.env = simpy.Environment()
        self.flash = Flash(self.env, dev)
        self.cores = Cores(self.env, dev.cpu_cores)
        self.driver = simpy.Resource(self.env, capacity=max(1, dev.npu_driver_slots))
        self.dram = SharedRate(self.env, dev.dram_gbps * 1e9) if dev.dram_gbps > 0 else None
        self.dispatch = Dispatcher(plan)
        self.idle: dict[str, list[simpy.Event]] = {r: [] for r in QUEUED}
        self.all_done = self.env.event()
        self.spans: list[Span] = []
        self.mem = 0
        self.peak_mem = 0
        self.mem_samples: list[tuple[float, int]] = [(0.0, 0)]

    # ---- dispatch (rules in planner.pipeline.dispatch, shared with the HIL runner) --------------------------------
    def _wake(self, resources: list[str]) -> None:
        for r in resources:
            if self.idle[r]:
                self.idle[r].pop(0).succeed()

    def _mem(self, delta: int) -> None:
        if delta:
            self.mem += delta
            self.peak_mem = max(self.peak_mem, self.mem)
            self.mem_samples.append((self.env.now, self.mem))

    def _after(self, wake: list[str], joins: list[int]) -> None:
        for j in joins:
            self._mem(-self.plan.tasks[j].mem_free)
        self._wake(wake)
        if self.dispatch.finished and not self.all_done.triggered:
            self.all_done.succeed()

    def _occupy(self, seconds: float, threads: int, dram_bytes: float, on_core: bool = True) -> list[simpy.Event]:
        """Events of one op's shared resources: its threads' core time and, where modelled, its DRAM traffic (demand
        rate = bytes / isolated time, so alone it ends exactly at `seconds`; with others it is slowed when the demands
        exceed `dram_gbps`)."""
        evs = [self.cores.run(seconds, threads) if on_core else self.env.timeout(seconds)]
        if self.dram is not None and dram_bytes > 0:
            evs.append(self.dram.use(dram_bytes, cap=dram_bytes / seconds))
        return evs

    def _touch_s(self, nbytes: int) -> float:
        """Core seconds of touching `nbytes` of newly allocated memory for the first time (`mem_fault_gbps`)."""
        return nbytes / (self.dev.mem_fault_gbps * 1e9) if nbytes > 0 and self.dev.mem_fault_gbps > 0 else 0.0

    # ---- workers -----------------------------------------------------------------------------------------------
    def _worker(self, resource: str, idx: int):
        env, plan, cost = self.env, self.plan, self.cost
        while True:
            got = self.dispatch.pop(resource)
            if got is None:
                ev = env.event()
                self.idle[resource].append(ev)
                yield ev
                continue
            tid, stolen, wake = got
            self._wake(wake)
            t = plan.tasks[tid]
            start = env.now
            self._mem(t.mem_alloc)
            cpu_s = 0.0
            if resource == "load":
                hit = min(self.preloaded, t.read_bytes) if t.layer >= 0 else 0
                self.preloaded -= hit
                nread = t.read_bytes - hit
                yield self.flash.read(nread, t.request_bytes, t.random_reads)
                # CPU side of the read: the kernel copies the pages into the user buffer (read_cpu_gbps), faulting in
                # the freshly allocated buffer (first touch, mem_fault_gbps). Measured on this host it adds to the
                # transfer rather than hiding under it (a 1-thread load of an INT8 file: transfer + copy + touch).
                read_cpu = (nread / (self.dev.read_cpu_gbps * 1e9) if self.dev.read_cpu_gbps > 0 else 0.0) \
                    + self._touch_s(t.mem_alloc)
                if read_cpu > 0:
                    yield env.all_of(self._occupy(read_cpu, 1, 2.0 * nread))
                copy_s = cost.copy_time(t.copy_bytes) + self._touch_s(t.copy_bytes)   # into a fresh NPU buffer
                cpu_s = copy_s + t.duration_s
                if copy_s > 0:
                    yield env.all_of(self._occupy(copy_s, 1, 2.0 * t.copy_bytes))
                if t.duration_s > 0:
                    yield self.cores.run(t.duration_s)
                unit = "io"
            elif resource == "graph":
                if t.duration_s > 0:
                    with self.driver.request() as slot:       # NPU driver work is serialized (npu_driver_slots)
                        yield slot
                        start = env.now                        # waiting for the driver is not restore work
                        yield self.cores.run(t.duration_s)
                unit = "graph"
            else:
                if resource == "unpack":
                    unit, threads, core = "cpu", 1, idx
                elif resource == "cpu" or stolen:
                    unit, threads, core = "cpu", plan.cpu_threads, plan.cpu_first_core
                else:
                    unit, threads, core = "npu", 1, 0
                if resource == "unpack" and self._touch_s(t.mem_alloc) > 0:   # the fresh INT8 output buffers
                    yield self.cores.run(self._touch_s(t.mem_alloc))
                for w in t.works:
                    dur = cost.op_time(w, unit, threads, core)
                    if dur > 0:
                        yield env.all_of(self._occupy(dur, threads, cost.dram_bytes(w, unit),
                                                      on_core=unit == "cpu" or self.dev.npu_on_cpu_core))
            self.spans.append(Span(tid, "cpu" if stolen else resource, idx, start, env.now, unit, stolen, cpu_s))
            self._mem(-t.mem_free)
            self._after(*self.dispatch.complete(tid))

    def run(self) -> Timeline:
        env = self.env
        for r in QUEUED:
            for i in range(self.plan.workers(r)):
                env.process(self._worker(r, i))
        self._after(*self.dispatch.start())
        if self.plan.tasks:
            try:
                env.run(until=self.all_done)
            except RuntimeError:        # SimPy: no events left before all_done -> reported below
                pass
        if not self.dispatch.finished:
            raise RuntimeError(f"plan deadlocked: {self.dispatch.done}/{len(self.plan.tasks)} tasks ran")
        return Timeline(self.plan, self.spans, env.now, self.flash.bytes_read, self.peak_mem, self.flash.samples,
                        self.mem_samples)


def simulate(plan: Plan, dev: SocProfile, cost: CostModel, preloaded_bytes: int = 0) -> Timeline:
    return PlanExecutor(plan, dev, cost, preloaded_bytes).run()
