"""Chrome / Perfetto trace export (`chrome://tracing`, ui.perfetto.dev): one track per resource worker.

Tracks (thread ids): flash bandwidth and allocated memory (counters, GB/s and GB), load-<i>, unpack-<i>, graph(-<i>),
cpu, npu; a resource with one worker has one track named after it. Each span becomes an "X" (complete) event in
microseconds with the task's name, layer, chunk and whether it was stolen. Reusable by any simulator that produces
(track, name, start s, end s, args) tuples: see `chrome_trace`.
"""
from __future__ import annotations

from typing import Any, Iterable

TRACK_ORDER = ("flash", "load", "unpack", "graph", "cpu", "npu")


def chrome_trace(events: Iterable[tuple[str, str, float, float, dict]], counters: dict[str, list[tuple[float, float]]]
                 | None = None, process: str = "sim") -> dict[str, Any]:
    """events: (track, name, start_s, end_s, args). counters: name -> [(time_s, value)]. Returns the JSON document."""
    tids: dict[str, int] = {}
    out: list[dict[str, Any]] = [{"ph": "M", "pid": 1, "name": "process_name", "args": {"name": process}}]

    def tid(track: str) -> int:
        if track not in tids:
            tids[track] = len(tids) + 1
            out.append({"ph": "M", "pid": 1, "tid": tids[track], "name": "thread_name", "args": {"name": track}})
            out.append({"ph": "M", "pid": 1, "tid": tids[track], "name": "thread_sort_index",
                        "args": {"sort_index": tids[track]}})
        return tids[track]

    for name, series in (counters or {}).items():
        tid(name)
        out += [{"ph": "C", "pid": 1, "name": name, "ts": t * 1e6, "args": {"value": v}} for t, v in series]
    for track, name, start, end, args in events:
        out.append({"ph": "X", "pid": 1, "tid": tid(track), "name": name, "ts": start * 1e6,
                    "dur": max(end - start, 0.0) * 1e6, "args": args})
    return {"traceEvents": out, "displayTimeUnit": "ms"}


def timeline_trace(tl) -> dict[str, Any]:
    """Chrome trace of a cold-start `Timeline` (sim.executor)."""
    tasks = tl.plan.tasks
    multi = {r: tl.plan.workers(r) > 1 for r in ("load", "unpack", "graph")}

    def track(s) -> str:
        return f"{s.resource}-{s.worker}" if multi.get(s.resource) else s.resource

    spans = sorted(tl.spans, key=lambda s: (TRACK_ORDER.index(s.resource), s.worker, s.start))
    events = [(track(s), tasks[s.task].name, s.start, s.end,
               {"layer": tasks[s.task].layer, "chunk": tasks[s.task].chunk, "stolen": s.stolen}) for s in spans]
    flash = [(t, r / 1e9) for t, r in tl.flash_samples]
    mem = [(t, b / 1e9) for t, b in tl.mem_samples]
    return chrome_trace(events, {"flash GB/s": flash, "memory GB": mem},
                        process=f"{tl.plan.framework} {tl.plan.model}")
