"""Executes a cold-start `Plan` in simulated time (SimPy): the simulator side of the plan contract (SPEC §2, §3.3).

Resources: `Flash` (processor-shared bandwidth) behind `load` workers, `unpack` workers (one CPU thread each, on
cores 0..k-1), the CPU compute pool (`cpu`, one op at a time on `plan.cpu_threads` threads from
`plan.cpu_first_core`), the NPU (`npu`, one op at a time), the `graph` thread and zero-time `join` barriers.
Dispatch rules (shared with the HIL runner, EdgeFlow §4.3): a task enters its resource's ready queue when its last
dependency finishes. `static`: the CPU and the NPU each run their ops strictly in backbone order (`Task.order`) and
wait when the next one is not ready yet; `position`: a unit runs any ready op, earliest (chunk, layer, backbone
position) first. An idle CPU steals the NPU queue's head when more than `steal_threshold` NPU ops are ready.
Durations come from the
`CostModel`; flash reads from the flash model. Ties are broken by sequence numbers, so runs are deterministic.
Memory: `mem_alloc` at task start, `mem_free` at task end, peak tracked. `preloaded_bytes` of layer weights (in load
order) are already resident (EdgeFlow Fig. 2's prefetching): their loads skip the flash read but keep copy/deserialize.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import simpy

from planner.cost.base import CostModel
from planner.device import SocProfile
from planner.plan import Plan
from sim.flash import Flash


@dataclass
class Span:
    task: int
    resource: str        # resource whose worker ran it ("cpu" for stolen NPU ops)
    worker: int
    start: float         # s
    end: float           # s
    unit: str            # cpu | npu | io | graph
    stolen: bool = False
    cpu_s: float = 0.0   # s of CPU work inside a load task (copy / deserialize)


@dataclass
class Timeline:
    plan: Plan
    spans: list[Span]
    end_s: float
    bytes_read: int
    peak_mem_bytes: int
    flash_samples: list[tuple[float, float]] = field(default_factory=list)
    mem_samples: list[tuple[float, int]] = field(default_factory=list)   # (time s, allocated B) at every change


class PlanExecutor:
    def __init__(self, plan: Plan, dev: SocProfile, cost: CostModel, preloaded_bytes: int = 0) -> None:
        self.plan, self.dev, self.cost = plan, dev, cost
        self.preloaded = int(preloaded_bytes)   # B of weights already in memory (Fig. 2): served without flash reads
        self.env = simpy.Environment()
        self.flash = Flash(self.env, dev)
        n = len(plan.tasks)
        self.left = [len(t.deps) for t in plan.tasks]
        self.children: list[list[int]] = [[] for _ in range(n)]
        for t in plan.tasks:
            for d in t.deps:
                self.children[d].append(t.id)
        self.queues: dict[str, list] = {r: [] for r in ("load", "unpack", "cpu", "npu", "graph")}
        self.idle: dict[str, list[simpy.Event]] = {r: [] for r in self.queues}
        self.next_order = {"cpu": 0, "npu": 0}   # static mode: backbone position each unit runs next
        self.done = 0
        self.all_done = self.env.event()
        self.spans: list[Span] = []
        self.mem = 0
        self.peak_mem = 0
        self.mem_samples: list[tuple[float, int]] = [(0.0, 0)]
        self.position = plan.schedule.priority == "position"
        self.thr = plan.schedule.steal_threshold

    # ---- dispatch ----------------------------------------------------------------------------------------------
    def _key(self, tid: int) -> tuple:
        t = self.plan.tasks[tid]
        if t.resource in ("cpu", "npu"):
            return (t.chunk, t.layer, t.topo, tid) if self.position else (t.order,)
        return (tid,)

    def _push(self, tid: int) -> None:
        t = self.plan.tasks[tid]
        if t.resource == "join":
            self._finish(tid)
            return
        heapq.heappush(self.queues[t.resource], (self._key(tid), tid))
        self._wake(t.resource)
        if t.resource == "npu" and self.thr and len(self.queues["npu"]) > self.thr:
            self._wake("cpu")

    def _wake(self, resource: str) -> None:
        if self.idle[resource]:
            self.idle[resource].pop(0).succeed()

    def _head_ok(self, resource: str) -> bool:
        q = self.queues[resource]
        if not q:
            return False
        if self.position or resource not in self.next_order:
            return True
        return q[0][0][0] == self.next_order[resource]

    def _take(self, resource: str) -> int:
        tid = heapq.heappop(self.queues[resource])[1]
        if not self.position and resource in self.next_order:
            self.next_order[resource] += 1
            self._wake(resource)          # the unit's next op may already be waiting in the queue
        return tid

    def _pop(self, resource: str) -> tuple[int, bool] | None:
        if self._head_ok(resource):
            return self._take(resource), False
        if resource == "cpu" and self.thr:
            nq = self.queues["npu"]
            if len(nq) > self.thr and self._head_ok("npu") and self.plan.tasks[nq[0][1]].stealable:
                return self._take("npu"), True
        return None

    def _mem(self, delta: int) -> None:
        if delta:
            self.mem += delta
            self.peak_mem = max(self.peak_mem, self.mem)
            self.mem_samples.append((self.env.now, self.mem))

    def _finish(self, tid: int) -> None:
        t = self.plan.tasks[tid]
        self._mem(-t.mem_free)
        self.done += 1
        for c in self.children[tid]:
            self.left[c] -= 1
            if self.left[c] == 0:
                self._push(c)
        if self.done == len(self.plan.tasks) and not self.all_done.triggered:
            self.all_done.succeed()

    # ---- workers -----------------------------------------------------------------------------------------------
    def _worker(self, resource: str, idx: int):
        env, plan, cost = self.env, self.plan, self.cost
        while True:
            got = self._pop(resource)
            if got is None:
                ev = env.event()
                self.idle[resource].append(ev)
                yield ev
                continue
            tid, stolen = got
            t = plan.tasks[tid]
            start = env.now
            self._mem(t.mem_alloc)
            cpu_s = 0.0
            if resource == "load":
                hit = min(self.preloaded, t.read_bytes) if t.layer >= 0 else 0
                self.preloaded -= hit
                yield self.flash.read(t.read_bytes - hit, t.request_bytes)
                cpu_s = cost.copy_time(t.copy_bytes) + t.duration_s
                if cpu_s > 0:
                    yield env.timeout(cpu_s)
                unit = "io"
            elif resource == "graph":
                if t.duration_s > 0:
                    yield env.timeout(t.duration_s)
                unit = "graph"
            else:
                if resource == "unpack":
                    unit, threads, core = "cpu", 1, idx
                elif resource == "cpu" or stolen:
                    unit, threads, core = "cpu", plan.cpu_threads, plan.cpu_first_core
                else:
                    unit, threads, core = "npu", 1, 0
                dur = sum(cost.op_time(w, unit, threads, core) for w in t.works)
                if dur > 0:
                    yield env.timeout(dur)
            self.spans.append(Span(tid, "cpu" if stolen else resource, idx, start, env.now, unit, stolen, cpu_s))
            self._finish(tid)

    def run(self) -> Timeline:
        env = self.env
        for r in self.queues:
            for i in range(self.plan.workers(r)):
                env.process(self._worker(r, i))
        for t in self.plan.tasks:
            if not t.deps:
                self._push(t.id)
        if self.plan.tasks:
            try:
                env.run(until=self.all_done)
            except RuntimeError:        # SimPy: no events left before all_done -> reported below
                pass
        if self.done != len(self.plan.tasks):
            raise RuntimeError(f"plan deadlocked: {self.done}/{len(self.plan.tasks)} tasks ran")
        return Timeline(self.plan, self.spans, env.now, self.flash.bytes_read, self.peak_mem, self.flash.samples,
                        self.mem_samples)


def simulate(plan: Plan, dev: SocProfile, cost: CostModel, preloaded_bytes: int = 0) -> Timeline:
    return PlanExecutor(plan, dev, cost, preloaded_bytes).run()
