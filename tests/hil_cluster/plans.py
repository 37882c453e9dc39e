"""Voltron plans of SmolLM2-135M on the Office cluster for the executor tests, built with the real planners
(`planner.voltron`: the MP / TP baselines, the Voltron controller's precision search + hybrid planner) and hand-made
PhasePlans for edge cases. Budgets are scaled down so that the 135M model must spread over the three devices."""
from __future__ import annotations

import dataclasses
from functools import lru_cache

import numpy as np

from planner.voltron.comm import LinkState
from planner.voltron.devices import Cluster, load_cluster
from planner.voltron.layers import layer_table
from planner.voltron.plan import TP, PhasePlan
from planner.voltron.policy import PlannerConfig
from planner.voltron.registry import build_context, make_policy
from planner.voltron.rssi import RssiTable
from quant.arch import model_spec

MODEL = "smollm2_135m"
BUDGETS_GB = (0.08, 0.06, 0.04)          # phone / tablet / watch share of a 135M model: forces 3-device plans


@lru_cache(maxsize=1)
def spec():
    return model_spec(MODEL)


@lru_cache(maxsize=1)
def table():
    return layer_table(spec())


def cluster(budgets_gb=BUDGETS_GB) -> Cluster:
    base = load_cluster("office")
    return Cluster(base.spec, [dataclasses.replace(d, mem_budget_gb=b) for d, b in zip(base.devices, budgets_gb)])


def links(dbm: float = -45.0) -> LinkState:
    return LinkState.from_rssi(RssiTable(), np.array([dbm, dbm]))


@lru_cache(maxsize=8)
def planner_plans(name: str, n_in: int = 64, qos_ttft_s: float = 10.0, qos_tpot_s: float = 0.4,
                  budgets_gb=BUDGETS_GB) -> tuple[PhasePlan, PhasePlan]:
    """(prefill, decode) plans of planner `name` (voltron | mp | tp) at a turn start with `n_in` prompt tokens."""
    cl = cluster(budgets_gb)
    cfg = PlannerConfig(name=name, profile_points=48, qos_ttft_s=qos_ttft_s, qos_tpot_s=qos_tpot_s)
    ctx, _ = build_context(spec(), cl, cfg)
    pol = make_policy(ctx)
    d = pol.start_turn(links(), cl.budgets(), n_in, 0)
    if d.oom:
        raise RuntimeError(f"planner {name}: no plan fits")
    return d.plan, d.next_plan


HYBRID_TURN = (1536, 1.0)               # prompt tokens, TTFT QoS (s): the precision search picks INT8/INT4 and prunes


def voltron_plans() -> tuple[PhasePlan, PhasePlan]:
    """The Voltron controller's (prefill, decode) plans for a long prompt under a tight TTFT: INT8/INT4 mix and pruned
    ATTN + FFN shards spread over the three devices."""
    return planner_plans("voltron", *HYBRID_TURN)


def hybrid_plan() -> PhasePlan:
    """Mixed MP/TP, mixed FP16/INT8/INT4, pruned shards: the Voltron prefill plan (`voltron_plans`) with every sublayer
    of blocks 0..9 that has >= 2 unpruned shards re-placed as TP (over three devices, or two for 2 shards) and some
    sublayers raised to FP16, each change kept only if the planner's own costing (`HybridPlanner.fixed`, for a 16-token
    turn: memory per device vs budget) still fits."""
    pre, _ = voltron_plans()
    cl = cluster()
    ctx, _ = build_context(spec(), cl, PlannerConfig(name="voltron", profile_points=48))
    pol = make_policy(ctx)
    env = pol.env(0, 16, 0, links(), cl.budgets())      # costed for the short turns the tests run (KV of 64 tokens)
    opt = pol.hp.options(env)
    shards, prec = pre.shards.copy(), pre.precision.copy()

    def fits(sh, pr) -> bool:
        return pol.hp.fixed(opt, env, pr, pre.act_precision, sh, pre.pruned).fits

    for j in range(20):
        k = int(shards[j].sum())
        if k >= 2:
            trial = shards.copy()
            trial[j] = [k - 2 * (k // 3), k // 3, k // 3] if k >= 3 else [k - 1, 1, 0]
            if fits(trial, prec):
                shards = trial
    for j in (0, 1, 58, 59, 30, 31):
        trial = prec.copy()
        trial[j] = 0
        if fits(shards, trial):
            prec = trial
    return pol.hp.fixed(opt, env, prec, pre.act_precision, shards, pre.pruned)


def hand_plan(strategy, shards, precision, pruned=None, phase="decode", kv_plan=64) -> PhasePlan:
    tb = table()
    N = tb.n
    return PhasePlan(model=MODEL, phase=phase, devices=list(cluster().spec.devices), n_tokens=1, kv_len=0,
                     kv_plan=kv_plan, precision=np.asarray(precision, dtype=np.int64),
                     act_precision=np.zeros(N, dtype=np.int64), strategy=np.asarray(strategy, dtype=np.int64),
                     shards=np.asarray(shards, dtype=np.int64),
                     pruned=np.zeros(N, dtype=np.int64) if pruned is None else np.asarray(pruned, dtype=np.int64),
                     act_pruned=np.zeros(N, dtype=bool))


def mp_split_plan(precision: int = 1, cuts=(20, 40)) -> PhasePlan:
    """Hand-made MP: sublayers [0, cuts[0]) on device 0, [cuts[0], cuts[1]) on 1, the rest on 2."""
    tb = table()
    N = tb.n
    dev = np.searchsorted(np.asarray(cuts), np.arange(N), side="right")
    sh = np.zeros((N, 3), dtype=np.int64)
    sh[np.arange(N), dev] = tb.shards[tb.type_of]
    return hand_plan(dev, sh, np.full(N, precision))


def tp_even_plan(precision: int = 1) -> PhasePlan:
    """Hand-made TP: ATTN 1/1/1 KV groups, FFN 11/11/10 channel groups."""
    tb = table()
    N = tb.n
    sh = np.zeros((N, 3), dtype=np.int64)
    sh[0::2] = [1, 1, 1]
    sh[1::2] = [11, 11, 10]
    return hand_plan(np.full(N, TP), sh, np.full(N, precision))
