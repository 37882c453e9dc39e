"""The one-time cost of restoring pruned ATTN shards (planner/voltron/controller.py `kv_rebuild_s`, `_hold_kv`,
`end_turn`; sim/multidevice/runner.py charges it): those shards have no KV for the cached context, so a restore
re-prefills the context. The planner takes a restore only when the step (or the TTFT, or the user's think time) can
pay for it. Simulated (modelled) runs."""
from __future__ import annotations

import dataclasses

import numpy as np

from planner.voltron.policy import restores_kv
from planner.voltron.registry import make_policy
from planner.voltron.rssi import RssiTable
from sim.multidevice.runner import run_conversation
from sim.multidevice.squeeze import Squeeze, trace_config
from sim.multidevice.workload import WorkloadConfig
from sim.wireless import RssiTrace
from tests.voltron.helpers import context, links


def _decode_plan():
    ctx, _ = context("qwen2_5_14b")
    pol = make_policy(ctx)
    lk = links(-45.0, -45.0)
    budgets = ctx.cluster.budgets()
    d = pol.start_turn(lk, budgets, 128, 0)
    return pol, lk, budgets, d.next_plan


def test_restores_kv_compares_attn_pruning_only():
    pol, lk, budgets, dec = _decode_plan()
    tb = pol.ctx.table
    env = pol.env(1, 1, 2000, lk, budgets)
    thin = pol._thin(dec, env, 0.5)
    assert restores_kv(tb, thin, dec) and not restores_kv(tb, dec, thin) and not restores_kv(tb, dec, dec)
    ffn_only = dataclasses.replace(dec, pruned=np.where(pol._attn, dec.pruned, thin.pruned))
    assert not restores_kv(tb, ffn_only, dec)                  # FFN shards hold no KV: restoring them is free


def test_unaffordable_restore_keeps_attn_pruning_and_affordable_one_is_charged():
    pol, lk, budgets, dec = _decode_plan()
    env = pol.env(1, 1, 2000, lk, budgets)
    thin = pol._thin(dec, env, 0.5)
    short, long = pol.kv_rebuild_s(thin, dec, 16, lk), pol.kv_rebuild_s(thin, dec, 2000, lk)
    assert 0 < short < long and pol.kv_rebuild_s(dec, thin, 2000, lk) == 0.0
    held, cost, deferred = pol._hold_kv(dec, thin, env, pol.tpot_target(), 2000, lk)
    assert deferred and cost == 0.0 and not restores_kv(pol.ctx.table, thin, held)
    assert np.array_equal(held.pruned[~pol._attn], dec.pruned[~pol._attn])      # the FFN shards come back
    assert held.est_time_s <= dec.est_time_s + 1e-12
    target = dec.est_time_s + short * 1.01                                      # the step can pay the rebuild
    same, cost, deferred = pol._hold_kv(dec, thin, env, target, 16, lk)
    assert same is dec and not deferred and cost == short


def test_simulated_restores_rebuild_kv_in_the_think_time_not_in_a_token():
    """Office / Qwen2.5-14B, the main device squeezed mid-conversation: bridges prune ATTN shards; restoring them
    re-prefills the context (seconds at 14B), which the planner leaves to the user's think time. The simulator
    charges every rebuild; none lands on a decode token and QoS holds."""
    ctx, _ = context("qwen2_5_14b")
    tc = trace_config("compute_squeeze")
    res = run_conversation(make_policy(ctx), ctx, RssiTrace.load(tc), RssiTable(), WorkloadConfig(turns=3),
                           seed=0, squeeze=Squeeze.load(tc))
    m = res.metrics
    assert m["kv_rebuilds"] >= 1 and m["kv_rebuild_s_total"] > 1.0, m            # rebuilt, at a cost
    dec = [r for r in res.timeline if r["phase"] == "decode"]
    assert max(r["stall_s"] for r in dec) < 0.4
    assert m["tpot_ms_p99"] <= 400 and m["ttft_s_max"] <= 10 and m["qos_tpot_violation_rate"] <= 0.01, m
