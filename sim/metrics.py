"""Cold-start metrics from a simulated timeline (definitions also in docs/coldstart.md).

- ttft_s: end of the LM head (first token's logits), from t = 0 (the app is launched, nothing of the model in memory).
- setup_s: time on the graph thread spent in `setup` tasks (QNN environment); 0 for CPU frameworks.
- load_s: wall span from the first flash read's start to the last load task's end (reads + copies/deserialization).
- unpack_s: wall span of unpack tasks (first start to last end); 0 when nothing is unpacked.
- graph_s: busy time of the graph thread in compose/optimize/prepare/restore tasks.
- prefill_s: wall span of the prefill phase: first compute (CPU or NPU) op's start to the LM head's end.
- cpu_bubble_rate / npu_bubble_rate: 1 - busy / prefill_s for the CPU compute pool / the NPU (Fig. 5c's "proportion of
  idle time to the execution time"); idle time waiting for weights counts as bubble. Stolen NPU ops count as CPU busy.
  npu_bubble_rate is null for CPU-only frameworks.
- peak_mem_gb: peak of allocated bytes (weights in every stage, embedding rows, KV cache) / 1e9; mem_headroom_gb:
  device DRAM minus that peak (negative: the cold start would not fit).
- energy_j: see sim.energy. bytes_read: bytes read from flash.
"""
from __future__ import annotations

from typing import Any

from planner.device import SocProfile
from sim.energy import energy_j
from sim.executor import Timeline


def _span(spans) -> float:
    return max(s.end for s in spans) - min(s.start for s in spans) if spans else 0.0


def coldstart_metrics(tl: Timeline, dev: SocProfile) -> dict[str, Any]:
    tasks = tl.plan.tasks
    by_phase: dict[str, list] = {}
    for s in tl.spans:
        by_phase.setdefault(tasks[s.task].phase, []).append(s)
    compute = [s for s in tl.spans if s.resource in ("cpu", "npu")]
    t0 = min((s.start for s in compute), default=0.0)
    prefill = tl.end_s - t0 if compute else 0.0
    cpu_busy = sum(s.end - s.start for s in compute if s.resource == "cpu")
    npu_busy = sum(s.end - s.start for s in compute if s.resource == "npu")
    has_npu = any(t.resource == "npu" for t in tasks)
    return {
        "ttft_s": tl.end_s,
        "setup_s": sum(s.end - s.start for s in by_phase.get("setup", [])),
        "load_s": _span(by_phase.get("load", [])),
        "unpack_s": _span(by_phase.get("unpack", [])),
        "graph_s": sum(s.end - s.start for s in by_phase.get("graph", [])),
        "prefill_s": prefill,
        "cpu_busy_s": cpu_busy,
        "npu_busy_s": npu_busy,
        "cpu_bubble_rate": max(0.0, 1.0 - cpu_busy / prefill) if prefill > 0 else 0.0,
        "npu_bubble_rate": (max(0.0, 1.0 - npu_busy / prefill) if prefill > 0 else 0.0) if has_npu else None,
        "stolen_ops": sum(1 for s in compute if s.stolen),
        "peak_mem_gb": tl.peak_mem_bytes / 1e9,
        "mem_headroom_gb": (dev.mem_capacity_bytes - tl.peak_mem_bytes) / 1e9,
        "energy_j": energy_j(tl, dev),
        "bytes_read": int(tl.bytes_read),
        "n_tasks": len(tasks),
    }
