"""Critical-path attribution of a cold start: which resource bounds each phase (EdgeFlow §3's bottleneck analysis;
docs/coldstart.md "Critical path").

Input is an execution record, `planner.timeline.Timeline` (the simulator's and the HIL runner's alike), so a modelled
and a measured cold start are read the same way. The walk starts at the last task to finish (the LM head) and goes
backwards: a task's *critical predecessor* is, of its dependencies and the span that ran before it on the same worker
(`Span.resource`, `Span.worker`), the one that finished last — what the task was waiting for when it started. Zero-time
`join` tasks write no span; they finish when their last dependency does and are walked through. Ties (finishes within
`TIE_S`) go to a dependency before the worker predecessor, then to the higher task id (the later task in the plan's
topological order, the one nearer the waiting task). Every second of [0, end_s] lands in one category:

- `flash`: load spans (reading from flash, plus the copy into NPU buffers or the deserialisation the load task does);
- `unpack`: unpack spans' own CPU time (`Span.cpu_s`; all of the span when the record gives no CPU time);
- `sharing`: the rest of an unpack span's wall time beyond its CPU time — waiting for a core, DRAM bandwidth or the
  interpreter lock, where the record shows it (one thread per unpack span, so wall − CPU time is waiting). Contention
  inside other spans is not separable from their work and stays in their unit (a flash read slowed by a second
  reader is `flash`, an op slowed by DRAM bandwidth is `cpu` or `npu`);
- `npu`, `cpu`: compute spans on the NPU and on the CPU pool (NPU ops the CPU stole count as `cpu`);
- `graph`: the graph thread (QNN set-up, graph restore / compose / optimise / prepare);
- `idle`: gaps where the path's next task had every input and a worker but had not started (dispatch, thread
  wake-ups), and the time before the path's first task.

Phases are time windows, the boundaries of `sim.metrics`: `load` is [0, first prefill span's start) — the tasks of
phase `prefill` mark it — and `prefill` the rest up to `end_s` (so `prefill` spans `prefill_s` of the metrics), `total`
is both. A pipelined cold start overlaps loading and compute, so the `prefill` window can be bound by `flash`: that is
the answer this module exists to give. A phase's *bound* is its category with the most seconds (ties: `CATEGORIES`
order).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from planner.timeline import Span, Timeline

CATEGORIES = ("flash", "unpack", "sharing", "npu", "cpu", "graph", "idle")
PHASES = ("load", "prefill", "total")
TIE_S = 1e-9        # s: finishes closer than this are a tie (float rounding of the simulated clock)


@dataclass
class Segment:
    """A piece of the critical path: `category` for [start, end] s, spent in `task` (-1: idle, no task)."""
    task: int
    category: str
    start: float     # s
    end: float       # s


@dataclass
class PhaseAttribution:
    phase: str
    start: float                                                  # s, window start
    end: float                                                    # s, window end
    seconds: dict[str, float] = field(default_factory=dict)      # category -> s of the path in the window

    @property
    def span_s(self) -> float:
        return self.end - self.start

    @property
    def share(self) -> dict[str, float]:
        total = sum(self.seconds.values())
        return {c: (v / total if total > 0 else 0.0) for c, v in self.seconds.items()}

    @property
    def bound(self) -> str:
        """The category with the most seconds ("" for an empty window)."""
        if not any(v > 0 for v in self.seconds.values()):
            return ""
        return max(CATEGORIES, key=lambda c: (self.seconds.get(c, 0.0), -CATEGORIES.index(c)))

    def to_json(self) -> dict[str, Any]:
        return {"start_s": self.start, "end_s": self.end, "seconds": dict(self.seconds), "share": self.share,
                "bound": self.bound}


@dataclass
class CriticalPath:
    tasks: list[int]                       # task ids on the path, first to last (spanned tasks only)
    segments: list[Segment]                # chronological, covering [0, end_s] without overlap
    phases: dict[str, PhaseAttribution]    # load | prefill | total

    def to_json(self) -> dict[str, Any]:
        """Per phase: window, seconds and share per category, bound; plus the path's length in tasks."""
        out: dict[str, Any] = {p: self.phases[p].to_json() for p in PHASES}
        out["path_tasks"] = len(self.tasks)
        return out


def span_category(span: Span, resource: str) -> str:
    """Category of a span's time (the unpack split into `unpack` / `sharing` is done by `_span_segments`)."""
    if span.stolen or span.resource == "cpu":
        return "cpu"
    if span.unit == "io" or resource == "load":
        return "flash"
    if resource in ("unpack", "npu", "graph"):
        return resource
    raise ValueError(f"task {span.task}: span of unknown resource {span.resource!r} (unit {span.unit!r})")


def _span_segments(span: Span, resource: str, until: float) -> list[Segment]:
    """The segments of `span` cut at `until` (a later path task started then), chronological."""
    end = min(span.end, until)
    if end <= span.start:
        return []
    cat = span_category(span, resource)
    if cat == "unpack" and 0.0 < span.cpu_s < span.end - span.start:
        # wall time beyond the thread's CPU time is waiting; put it last (where in the span it fell is not recorded)
        own_end = min(end, span.start + span.cpu_s)
        return [Segment(span.task, "unpack", span.start, own_end)] + (
            [Segment(span.task, "sharing", own_end, end)] if end > own_end else [])
    return [Segment(span.task, cat, span.start, end)]


def critical_path(tl: Timeline) -> CriticalPath:
    """The critical path of `tl` walked back from its last task, with every second of [0, end_s] attributed."""
    tasks = tl.plan.tasks
    span_of: dict[int, Span] = {}
    for s in tl.spans:
        if s.task in span_of:
            raise ValueError(f"task {s.task}: more than one span in the timeline (one per task expected)")
        if not 0 <= s.task < len(tasks):
            raise ValueError(f"span of task {s.task}: no such task in the plan ({len(tasks)} tasks)")
        if s.end < s.start:
            raise ValueError(f"task {s.task}: span ends before it starts ({s.start} > {s.end})")
        span_of[s.task] = s
    worker_prev: dict[int, int] = {}
    by_worker: dict[tuple[str, int], list[Span]] = {}
    for s in tl.spans:
        by_worker.setdefault((s.resource, s.worker), []).append(s)
    for spans in by_worker.values():
        spans.sort(key=lambda s: (s.start, s.end, s.task))
        for a, b in zip(spans, spans[1:]):
            worker_prev[b.task] = a.task
    finish: list[float] = []                 # s, each task's end (joins: their last dependency's)
    for t in tasks:
        if t.id in span_of:
            finish.append(span_of[t.id].end)
        elif t.resource == "join":
            finish.append(max((finish[d] for d in t.deps), default=0.0))
        else:
            finish.append(float("nan"))     # a task the record does not show ran (unfinished run)

    def latest(cands: list[tuple[int, int]]) -> int | None:
        """Of (rank, task) candidates, the latest finisher; ties: lower rank (dependency = 0), then higher id."""
        cands = [(r, c) for r, c in cands if finish[c] == finish[c]]
        if not cands:
            return None
        top = max(finish[c] for _, c in cands)
        tied = [(r, c) for r, c in cands if finish[c] >= top - TIE_S]
        return min(tied, key=lambda rc: (rc[0], -rc[1]))[1]

    def resolve(tid: int | None) -> int | None:
        """Through joins to the spanned task that made them ready (None: the path starts at t = 0)."""
        while tid is not None and tid not in span_of:
            tid = latest([(0, d) for d in tasks[tid].deps])
        return tid

    if not span_of:
        raise ValueError("timeline has no spans")
    last = max(span_of, key=lambda i: (span_of[i].end, i))
    path: list[int] = []
    segs: list[Segment] = []
    cursor = max(tl.end_s, span_of[last].end)
    cur: int | None = last
    seen: set[int] = set()
    while cur is not None and cur not in seen:   # zero-length spans at one instant could otherwise point in a circle
        seen.add(cur)
        s = span_of[cur]
        if s.end < cursor:
            segs.append(Segment(-1, "idle", s.end, cursor))
        segs.extend(reversed(_span_segments(s, tasks[cur].resource, cursor)))
        cursor = min(cursor, s.start)
        path.append(cur)
        cands = [(0, d) for d in tasks[cur].deps] + ([(1, worker_prev[cur])] if cur in worker_prev else [])
        cur = resolve(latest(cands))
    if cursor > 0:
        segs.append(Segment(-1, "idle", 0.0, cursor))
    segs.reverse()
    path.reverse()
    return CriticalPath(path, segs, _phases(tl, span_of, segs, cursor_end=max(tl.end_s, span_of[last].end)))


def _phases(tl: Timeline, span_of: dict[int, Span], segs: list[Segment], cursor_end: float) -> dict[str,
                                                                                                    PhaseAttribution]:
    tasks = tl.plan.tasks
    starts = [s.start for i, s in span_of.items() if tasks[i].phase == "prefill"]
    t_p = min(starts) if starts else cursor_end
    windows = {"load": (0.0, t_p), "prefill": (t_p, cursor_end), "total": (0.0, cursor_end)}
    out = {}
    for name, (a, b) in windows.items():
        secs = dict.fromkeys(CATEGORIES, 0.0)
        for g in segs:
            overlap = min(g.end, b) - max(g.start, a)
            if overlap > 0:
                secs[g.category] += overlap
        out[name] = PhaseAttribution(name, a, b, secs)
    return out
