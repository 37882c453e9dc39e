"""The simulated "real" time of one step of a Voltron plan (what a device cluster would measure).

A thin functional entry point to the simulator's own device and link model (`sim.multidevice.device_model`, see its
docstring): per-sublayer compute from each device's spec-sheet throughput with per-op efficiencies, link transfers
from the RSSI goodput table with per-message latency, overhead and jitter, TP sublayers as an event schedule on the
shared channel. It never calls the planner's cost functions: the planner predicts with its fitted regression, so the
gap between `PhasePlan.est_time_s` and this is the planner's prediction error.
"""
from __future__ import annotations

import numpy as np

from planner.voltron.comm import LinkState
from planner.voltron.devices import Cluster
from planner.voltron.layers import LayerTable
from planner.voltron.plan import PhasePlan
from sim.multidevice.device_model import GroundTruth, TruthAssumptions


def step_time(plan: PhasePlan, table: LayerTable, cluster: Cluster, n_tokens: int, kv_len: int, links: LinkState,
              rng: np.random.Generator, jitter: float = 0.03, head_precision: int = 1,
              assumptions: TruthAssumptions | None = None) -> tuple[float, float, float]:
    """(seconds for one step, of which communication, joules) of `plan` processing `n_tokens` with `kv_len` cached.

    Energy: every device draws P(f) = P_idle + P_dyn·f³ while it computes and P_idle otherwise during the step
    (radio power is folded into P_idle; devices holding no shards are not counted). For many steps build one
    `GroundTruth` and call its `step` (what the conversation runner does)."""
    return GroundTruth(cluster, table, head_precision, assumptions).step(plan, n_tokens, kv_len, links, rng, jitter)
