"""The simulated "real" time of one step of a Voltron plan (what a device cluster would measure).

Per sublayer, every device that holds shards runs its fraction of the work with the roofline device model
(`planner.voltron.devices.device_time`: compute- vs memory-bound, batch utilisation, per-op overhead) times a per-step,
per-device jitter (log-normal, σ = `jitter`, seeded: OS noise, DVFS governors); the sublayer takes as long as its
slowest device; TP sublayers add broadcast + aggregation and MP boundaries add activation transfers, with the
communication model of `planner.voltron.comm` on the *true* links of this instant (also jittered). The LM head runs on
the main device. The planner never sees this function: it predicts with the fitted regression, so the gap between
`PhasePlan.est_time_s` and this is the planner's prediction error.
"""
from __future__ import annotations

import numpy as np

from planner.voltron.comm import LinkState
from planner.voltron.devices import ACT_BYTES, BYTES_PER_WEIGHT, Cluster, device_time
from planner.voltron.hybrid import HybridPlanner
from planner.voltron.layers import HEAD, LayerTable
from planner.voltron.plan import TP, PhasePlan


def step_time(plan: PhasePlan, table: LayerTable, cluster: Cluster, n_tokens: int, kv_len: int, links: LinkState,
              rng: np.random.Generator, jitter: float = 0.03, head_precision: int = 1) -> tuple[float, float, float]:
    """(seconds for one step, of which communication, joules) of `plan` processing `n_tokens` with `kv_len` cached.

    Energy: every device draws P(f) = P_idle + P_dyn·f³ while it computes and P_idle otherwise during the step
    (radio power is folded into P_idle; devices holding no shards are not counted)."""
    feats, _ = table.features(n_tokens, kv_len)                           # (6, 3)
    ty = table.type_of
    S = table.shards[ty].astype(float)                                    # (N,)
    D = cluster.n
    j = np.exp(rng.normal(0.0, jitter, D + 1)) if jitter > 0 else np.ones(D + 1)
    t_dev = np.zeros((table.n, D))
    n_arr = np.full(table.n, float(n_tokens))
    freq = plan.freq if plan.freq.size == D else np.ones(D)
    for d, dev in enumerate(cluster.devices):
        k = plan.shards[:, d]
        if not k.any():
            continue
        f = k / S
        ops = f * feats[ty, 0]
        byts = f * (feats[ty, 1] * BYTES_PER_WEIGHT[plan.precision] + feats[ty, 2])
        t = device_time(dev, plan.precision, n_arr, ops, byts, float(freq[d])) * j[d]
        t_dev[:, d] = np.where(k > 0, t, 0.0)
    comp = float(t_dev.max(axis=1).sum())
    used = plan.shards > 0
    tp = used.sum(axis=1) > 1
    act_bytes = n_tokens * table.act_width * ACT_BYTES                    # (A,)
    comm = 0.0
    if tp.any():
        comm += float(links.tp_comm(act_bytes[plan.act_precision[tp]], used[tp]).sum())
    strategy = np.where(tp, TP, np.where(used.any(axis=1), used.argmax(axis=1), 0))
    comm += HybridPlanner.boundary_comm(strategy, plan.act_precision, links.hop(act_bytes))
    comm *= j[D]
    head = float(device_time(cluster.devices[0], np.array(head_precision), np.array(1.0), feats[HEAD, 0],
                             feats[HEAD, 1] * BYTES_PER_WEIGHT[head_precision], float(freq[0]))) * j[0]
    total = comp + comm + head
    busy = t_dev.sum(axis=0)
    busy[0] += head
    energy = 0.0
    for d, dev in enumerate(cluster.devices):
        if d == 0 or plan.shards[:, d].any():
            energy += float(dev.power_w(freq[d])) * min(busy[d], total) + dev.p_idle_w * max(total - busy[d], 0.0)
    return total, comm, energy
