"""EdgeFlow's dynamic dispatch rules, one implementation for both executors (EdgeFlow §4.3; docs/hil.md).

`Dispatcher` owns dependency counting, the per-resource ready queues and the rules that pick the next task:
- `static` priority: the CPU and the NPU each run their ops strictly in backbone order (`Task.order`) and wait when the
  next one is not ready yet (llm.npu's static backbone);
- `position` priority: a unit runs any ready op, earliest (chunk, layer, backbone position) first;
- CPU task stealing: an idle CPU takes the head of the NPU queue when more than `steal_threshold` NPU ops are ready
  and the head is stealable (an INT8 matmul).
Other resources (loaders, unpackers, graph threads) take ready tasks in plan order (task id). `join` tasks complete the
moment they become ready. The simulator (`sim.executor`, one event loop) calls it directly; the HIL runner
(`hil.runner`, OS threads) calls it under one lock. Both wake idle workers of the resources `push`/`pop` name.
Ties are broken by task id, so a run is deterministic for a given completion order. Where setup.py compiled it
(`dispatch.pxd`, docs/coldstart.md "Benchmarks"), `Dispatcher` is an extension type with C counters.
"""
from __future__ import annotations

from heapq import heappop, heappush

from planner.plan import Plan

QUEUED = ("load", "unpack", "cpu", "npu", "graph")


class Dispatcher:
    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.tasks = plan.tasks
        self.left = [len(t.deps) for t in plan.tasks]
        self.children: list[list[int]] = [[] for _ in plan.tasks]
        for t in plan.tasks:
            for d in t.deps:
                self.children[d].append(t.id)
        self.queues: dict[str, list[tuple[tuple, int]]] = {r: [] for r in QUEUED}
        self.next_order = {"cpu": 0, "npu": 0}     # static mode: backbone position each unit runs next
        self.position = plan.schedule.priority == "position"
        self.thr = plan.schedule.steal_threshold
        self.done = 0

    @property
    def finished(self) -> bool:
        return self.done == len(self.tasks)

    def start(self) -> tuple[list[str], list[int]]:
        """Enqueue the tasks without dependencies. Returns (resources to wake, join tasks completed)."""
        wake: list[str] = []
        joins: list[int] = []
        for t in self.tasks:
            if not t.deps:
                self._ready(t.id, wake, joins)
        return wake, joins

    def complete(self, tid: int) -> tuple[list[str], list[int]]:
        """Task `tid` finished: release its children. Returns (resources to wake, join tasks completed as a result)."""
        wake: list[str] = []
        joins: list[int] = []
        self._release(tid, wake, joins)
        return wake, joins

    def pop(self, resource: str) -> tuple[int, bool, list[str]] | None:
        """Next task for an idle worker of `resource`: (task id, stolen, resources to wake) or None (wait)."""
        if self._head_ok(resource):
            return self._taken(resource, False)
        if resource == "cpu" and self.thr:
            nq = self.queues["npu"]
            if len(nq) > self.thr and self._head_ok("npu") and self.tasks[nq[0][1]].stealable:
                return self._taken("npu", True)
        return None

    # ---- internals ---------------------------------------------------------------------------------------------
    def _key(self, tid: int) -> tuple:
        t = self.tasks[tid]
        if t.resource in ("cpu", "npu"):
            return (t.chunk, t.layer, t.topo, tid) if self.position else (t.order,)
        return (tid,)

    def _ready(self, tid: int, wake: list[str], joins: list[int]) -> None:
        t = self.tasks[tid]
        if t.resource == "join":
            joins.append(tid)
            self._release(tid, wake, joins)
            return
        heappush(self.queues[t.resource], (self._key(tid), tid))
        wake.append(t.resource)
        if t.resource == "npu" and self.thr and len(self.queues["npu"]) > self.thr:
            wake.append("cpu")

    def _release(self, tid: int, wake: list[str], joins: list[int]) -> None:
        self.done += 1
        for c in self.children[tid]:
            self.left[c] -= 1
            if self.left[c] == 0:
                self._ready(c, wake, joins)

    def _head_ok(self, resource: str) -> bool:
        q = self.queues[resource]
        if not q:
            return False
        if self.position or resource not in self.next_order:
            return True
        return q[0][0][0] == self.next_order[resource]

    def _taken(self, resource: str, stolen: bool) -> tuple[int, bool, list[str]]:
        tid = heappop(self.queues[resource])[1]
        wake: list[str] = []
        if not self.position and resource in self.next_order:
            self.next_order[resource] += 1
            wake.append(resource)          # the unit's next op may already be waiting in the queue
        return tid, stolen, wake
