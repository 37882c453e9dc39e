"""The QoS promise on the simulator (sim/multidevice/qos_sweep.py; docs/multidevice.md "QoS over every cluster ×
model × trace"): wherever a plan exists, Voltron keeps TPOT p99 ≤ 400 ms, ≤ 1 % of the tokens over 400 ms and every
TTFT ≤ 10 s. The rows below are the sweep's closest ones on the shipped traces: a bridge (the running plan with
communication scaling and pruning) must give way to the re-planned placement once it has loaded, or its steps drift
above 400 ms as the link weakens. Simulated (modelled) runs, 3 turns, seed 0."""
from __future__ import annotations

import pytest

from sim.multidevice.qos_sweep import sweep


@pytest.mark.parametrize("cluster", ["car", "office"])
def test_qwen1_5_7b_walk_away_disconnect_meets_qos(cluster):
    (r,) = sweep(traces=("walk_away_disconnect",), turns=3, clusters=(cluster,), models=["qwen1_5_7b"],
                 progress=False)
    assert not r["oom"], r
    assert r["tpot_ms_p99"] <= 400.0 and r["qos_tpot_violation_rate"] <= 0.01 and r["ttft_s_max"] <= 10.0, r
    assert r["tokens_generated"] > 300, r
