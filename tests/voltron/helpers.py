"""Shared builders for the Voltron tests (cached: fitting a latency model takes ~0.5 s)."""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from planner.voltron.comm import LinkState
from planner.voltron.devices import load_cluster
from planner.voltron.policy import PlannerConfig
from planner.voltron.registry import make_policy
from planner.voltron.rssi import RssiTable
from quant.arch import model_spec
from sim.multidevice.runner import build_run_context


@lru_cache(maxsize=16)
def context(model: str, cluster: str = "office", name: str = "voltron", balance: str = "hetero", points: int = 96):
    # the planner profiles the simulated devices
    ctx, acc = build_run_context(model_spec(model), load_cluster(cluster),
                                 PlannerConfig(name=name, balance=balance, profile_points=points))
    return ctx, acc


def policy(model: str, cluster: str = "office", name: str = "voltron", balance: str = "hetero"):
    return make_policy(context(model, cluster, name, balance)[0])


def links(*dbm: float) -> LinkState:
    return LinkState.from_rssi(RssiTable(), np.array(dbm, dtype=float))


def tiny_policy(n_layers: int = 3, budgets_gb=(0.52, 0.12, 0.08)):
    """Qwen2.5-3B cut to `n_layers` blocks on the Home cluster, budgets scaled so memory binds (brute-force size)."""
    import dataclasses

    from planner.voltron.devices import Cluster
    from planner.voltron.importance import importance_for
    from planner.voltron.latency import fit_for
    from planner.voltron.layers import layer_table
    from planner.voltron.policy import PolicyContext

    spec = dataclasses.replace(model_spec("qwen2_5_3b"), n_layers=n_layers)
    base = load_cluster("home")
    devs = [dataclasses.replace(d, mem_budget_gb=b) for d, b in zip(base.devices, budgets_gb)]
    cluster = Cluster(base.spec, devs)
    table = layer_table(spec)
    lat, _ = fit_for(cluster.devices, table, points=64)
    ctx = PolicyContext(table=table, cluster=cluster, latency=lat, importance=importance_for(spec),
                        cfg=PlannerConfig())
    return make_policy(ctx)


def brute_force(pol, env, qos: float):
    """Best accuracy over all 3^N precision assignments that fit and meet `qos` (each planned by the hybrid planner)."""
    import itertools

    from planner.voltron.accuracy import accuracy_proxy

    hp, N = pol.hp, pol.ctx.table.n
    opt = hp.options(env)
    zeros = np.zeros(N, dtype=np.int64)
    best, best_prec = None, None
    for combo in itertools.product(range(3), repeat=N):
        prec = np.array(combo, dtype=np.int64)
        fits, est = hp.quick(opt, env, prec)
        if fits and est <= qos:
            acc = accuracy_proxy(hp.table.spec.name, pol.ctx.importance, pol.ctx.cfg.accuracy, prec, zeros,
                                 np.zeros(N))
            if best is None or acc > best:
                best, best_prec = acc, prec
    return best, best_prec
