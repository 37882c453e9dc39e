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
              rng: np.random.Generator, jitter: float = 0.03, head_precision: int = 1) -> tuple[float, float]:
    """(seconds for one step, of which communication) of `plan` processing `n_tokens` with `kv_len` cached."""
    feats, _ = table.features(n_tokens, kv_len)                           # (6, 3)
    ty = table.type_of
    S = table.shards[ty].astype(float)                                    # (N,)
    D = cluster.n
    j = np.exp(rng.normal(0.0, jitter, D + 1)) if jitter > 0 else np.ones(D + 1)
    t_dev = np.zeros((table.n, D))
    n_arr = np.full(table.n, float(n_tokens))
    for d, dev in enumerate(cluster.devices):
        k = plan.shards[:, d]
        if not k.any():
            continue
        f = k / S
        ops = f * feats[ty, 0]
        byts = f * (feats[ty, 1] * BYTES_PER_WEIGHT[plan.precision] + feats[ty, 2])
        t = device_time(dev, plan.precision, n_arr, ops, byts) * j[d]
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
                             feats[HEAD, 1] * BYTES_PER_WEIGHT[head_precision])) * j[0]
    return comp + comm + head, comm
