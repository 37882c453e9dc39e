"""Single-device cold-start scenario: one framework policy per file, selected by `framework.policy`
(docs/design.md §4.4).

`run_coldstart` builds the plan with the policy, simulates it and returns (plan, timeline, metrics).
"""
from __future__ import annotations

from sim.coldstart.base import ColdStartInputs, ColdStartPolicy
from sim.coldstart.edgeflow import EdgeFlow
from sim.coldstart.ef_mixed import EfMixed
from sim.coldstart.ef_pack import EfPack
from sim.coldstart.ef_pipe import EfPipe
from sim.coldstart.ef_place import EfPlace
from sim.coldstart.ef_priority import EfPriority
from sim.coldstart.llamacpp import LlamaCpp
from sim.coldstart.llmnpu import LlmNpu
from sim.coldstart.llmnpu_mat import LlmNpuMat
from sim.coldstart.llmnpu_plus import LlmNpuPlus
from sim.coldstart.mnn import Mnn

POLICIES: dict[str, type[ColdStartPolicy]] = {p.name: p for p in (
    LlamaCpp, Mnn, LlmNpu, LlmNpuMat, LlmNpuPlus, EfMixed, EfPack, EfPipe, EfPlace, EfPriority, EdgeFlow)}


def run_coldstart(x: ColdStartInputs):
    from sim.executor import simulate
    from sim.metrics import coldstart_metrics

    plan = POLICIES[x.framework.policy]().build(x)
    tl = simulate(plan, x.device, x.cost, x.preloaded_bytes)
    metrics = coldstart_metrics(tl, x.device)
    return plan, tl, metrics


__all__ = ["POLICIES", "ColdStartInputs", "ColdStartPolicy", "run_coldstart"]
