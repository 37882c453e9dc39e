"""Per-phase summary of a measured cold start (docs/hil.md "Runner"): what a table or a metrics file reports.

Owns the reduction of a measured `Timeline` to flat numbers: TTFT (end of the last span), and per resource class
(load, unpack, graph, prefill = cpu + npu spans) the first start, last end and busy seconds (sum of span lengths;
overlapping workers add up), plus stolen ops and bytes read. Every value is measured (seconds on this host).
"""
from __future__ import annotations

from planner.plan import Plan
from planner.timeline import Timeline

PHASES = {"load": "load", "unpack": "unpack", "graph": "graph", "cpu": "prefill", "npu": "prefill"}


def phase_summary(plan: Plan, tl: Timeline) -> dict[str, float]:
    """Flat dict: ttft_s, <phase>_start_s / <phase>_end_s / <phase>_busy_s, npu_standin_busy_s, stolen_ops,
    bytes_read, peak_mem_bytes (the plan's accounting)."""
    out: dict[str, float] = {"ttft_s": tl.end_s}
    for s in tl.spans:
        ph = PHASES[plan.tasks[s.task].resource]
        out[f"{ph}_start_s"] = min(out.get(f"{ph}_start_s", s.start), s.start)
        out[f"{ph}_end_s"] = max(out.get(f"{ph}_end_s", s.end), s.end)
        out[f"{ph}_busy_s"] = out.get(f"{ph}_busy_s", 0.0) + (s.end - s.start)
        if s.unit == "npu":
            out["npu_standin_busy_s"] = out.get("npu_standin_busy_s", 0.0) + (s.end - s.start)
    out["stolen_ops"] = sum(s.stolen for s in tl.spans)
    out["bytes_read"] = tl.bytes_read
    out["peak_mem_bytes"] = tl.peak_mem_bytes
    return out
