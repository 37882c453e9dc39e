"""Chrome / Perfetto trace of an emulated-cluster run (docs/cluster.md): one track per device worker (the calls the
coordinator made on it: sublayer segments, TP shards, loads, KV moves) and one per link (every RPC message on it,
one-way latency and bytes). All times measured on the controller's monotonic clock."""
from __future__ import annotations

import math
from dataclasses import asdict, is_dataclass


def chrome_trace(spans: list[dict], messages: dict, device_names: list[str], spans_base_s: float = 0.0) -> dict:
    """spans: `Coordinator.spans` as dicts (t0_s relative to `spans_base_s` on the monotonic clock); messages:
    `EmulatedCluster.drain_trace()` (per worker name, `MessageRecord`s in order of the devices)."""
    ev: list[dict] = [{"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "devices (measured)"}},
                      {"ph": "M", "pid": 2, "name": "process_name", "args": {"name": "links (measured)"}}]
    for i, n in enumerate(device_names):
        ev.append({"ph": "M", "pid": 1, "tid": i, "name": "thread_name", "args": {"name": f"d{i} {n}"}})
        ev.append({"ph": "M", "pid": 2, "tid": i, "name": "thread_name", "args": {"name": f"main <-> d{i} {n}"}})
    recs = [(i, r if not is_dataclass(r) else asdict(r)) for i, rs in enumerate(messages.values()) for r in rs]
    base = min([r["t_call"] for _, r in recs] + [spans_base_s + s["t0_s"] for s in spans] or [0.0])
    for s in spans:
        name = s["method"] if s["j0"] < 0 else f"{s['method']} [{s['j0']},{s['j1']})"
        ev.append({"ph": "X", "pid": 1, "tid": s["device"], "name": name,
                   "ts": 1e6 * (spans_base_s + s["t0_s"] - base), "dur": 1e6 * s["dur_s"],
                   "args": {"step": s["step"], "phase": s["phase"], "bytes_sent": s["bytes_sent"],
                            "bytes_recv": s["bytes_recv"]}})
    for i, r in recs:
        end = r["t_done"] if math.isfinite(r["t_done"]) else r["t_call"]
        ev.append({"ph": "X", "pid": 2, "tid": i, "name": r["method"], "ts": 1e6 * (r["t_call"] - base),
                   "dur": 1e6 * max(0.0, end - r["t_call"]),
                   "args": {"bytes_out": r["bytes_out"], "bytes_in": r["bytes_in"], "latency_s": r["latency_s"],
                            "ok": r["ok"], "error": r.get("error", "")}})
    return {"traceEvents": ev, "displayTimeUnit": "ms"}
