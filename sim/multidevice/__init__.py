"""Multi-device inference over time (Voltron §4–5; docs/design.md §5): conversation workload, plan execution with the
device roofline models and the wireless links, turn by turn and token by token, and the per-token timeline.

- `workload.py`  LMSYS-Chat-1M-like multi-turn conversations (input/output lengths), KV cache accumulating over turns
- `execute.py`   the "real" time of one step of a plan (device roofline + jitter + links), what the simulator measures
- `runner.py`    the SimPy process that drives a policy through a conversation under an RSSI trace → metrics + timeline
- `report.py`    cluster × model family × planner table for docs/multidevice.md
"""
