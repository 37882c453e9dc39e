"""Voltron: elastic multi-device LLM inference planning (Voltron §3–4; docs/multidevice.md).

One policy per file:
- `devices.py`     device / cluster profiles (typed schemas of conf/device, conf/cluster) and the roofline device model
- `rssi.py`        RSSI → goodput / latency table (IEEE 802.11ac minimum receiver sensitivity)
- `comm.py`        communication model (bytes / goodput(RSSI) + latency) over a Wi-Fi Direct star
- `layers.py`      per-sublayer (ATTN / FFN) workload table of a ModelSpec (layer variants: MHA/GQA/SWA, dense/MoE)
- `latency.py`     latency regression fitted on profiling runs (accuracy reported on held-out points)
- `importance.py`  per-layer importance (measured on SmolLM2, depth proxy for large models)
- `accuracy.py`    accuracy proxy of a plan (base benchmark score × importance-weighted losses)
- `plan.py`        the plan objects (typed, JSON-serialisable)
- `hybrid.py`      layer-wise hybrid MP/TP planner (§4.2.1), composed of `options.py` (per-class option tables) and
                   `assign.py` (sequential memory-aware pass + boundary repair)
- `precision.py`   importance-aware mixed precision by binary search, with shard pruning (§4.2.2, §4.3.1)
- `policy.py`      the policy contract the simulator drives (turn start / every token) + planner config schema
- `controller.py`  Voltron: elastic controller evaluated token by token (§4.3, §4.4)
- `static.py`      shared rule of the baselines (uniform precision, no elasticity); `single.py`, `mp.py`, `tp.py`:
                   single device, heterogeneity-aware MP and TP (and their equal-split variants) (§5.1.3)
- `registry.py`    the one registry of policy names (planner name → policy class); fitted run context
- `data/smollm2_importance.json`  SmolLM2 importance, measured offline by `quant.measure_importance` (it runs the
                   real model, so it lives in quant/)
"""
