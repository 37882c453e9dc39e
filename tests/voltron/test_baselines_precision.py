"""Baselines (paper §3.2.2 Fig. 4b, §5.1.3) and the importance-aware precision search (§4.2.2)."""
from __future__ import annotations

import numpy as np

from planner.voltron.accuracy import accuracy_proxy
from tests.voltron.helpers import brute_force, links, policy, tiny_policy


def _start(pol, n_in=64, kv=0, dbm=-45):
    return pol.start_turn(links(dbm, dbm), pol.ctx.cluster.budgets(), n_in, kv)


def test_equal_split_mp_tp_oom_on_office_voltron_fits():
    # Pixel 2 XL (2.3 GB) cannot hold a third of a 14B model (+ its third of the KV cache after a few turns) even at
    # INT4 (paper Fig. 4b). Qwen2.5-14B's equal TP split is 3/3/2 of its 8 KV-head groups: the watch's share fits.
    for model, names in (("qwen1_5_14b", ("mp", "tp")), ("qwen2_5_14b", ("mp",))):
        for name in names:
            d = _start(policy(model, name=name, balance="equal"), kv=1024)
            assert d.oom, (model, name)
        v = _start(policy(model), kv=1024)
        assert not v.oom and v.plan.fits and v.next_plan.fits
        assert (v.next_plan.mem_bytes <= v.next_plan.budget_bytes).all()
        assert not _start(policy(model, name="mp")).oom        # heterogeneity-aware MP fits (memory-capped)


def test_single_device_runs_small_not_large():
    # a 14B model fits no device once the fastest one (the only one Single uses, paper footnote 6) has half its budget
    big = policy("qwen2_5_14b", name="single")
    assert big.start_turn(links(-45, -45), big.ctx.cluster.budgets() * np.array([1, 0.5, 1]), 64, 0).oom
    pol = policy("qwen2_5_7b", name="single")
    d = _start(pol)
    assert not d.oom
    used = d.plan.shards.sum(axis=0) > 0
    assert used.sum() == 1                                       # exactly one device holds the whole model
    opt = pol.hp.options(pol.env(1, 1, 64, links(-45, -45), pol.ctx.cluster.budgets()))
    assert used.argmax() == pol.speeds(opt, int(d.plan.precision[0]), np.ones(3, bool)).argmax()   # the fastest


def test_binary_search_equals_linear_scan():
    pol = policy("qwen2_5_14b")
    s = pol.search
    for kv, qos in ((512, 0.38), (3000, 0.5), (0, 0.2)):
        env = pol.env(1, 1, kv, links(-50, -50), pol.ctx.cluster.budgets())
        res = s.search([(env, qos)])
        ok = [pol.hp.quick(pol.hp.options(env), env, s.precision_at(m))[0] and
              pol.hp.quick(pol.hp.options(env), env, s.precision_at(m))[1] <= qos for m in range(s.m_max + 1)]
        if any(ok):
            first = ok.index(True)
            # binary search assumes monotonicity; it must land on a feasible m no worse than the first feasible one
            # found by a linear scan whenever the predicate is monotone from there on
            if all(ok[first:]):
                assert res.m == first
            assert ok[res.m]
        assert res.steps <= 2 * int(np.ceil(np.log2(s.m_max + 1))) + 3


def test_search_vs_brute_force_tiny():
    """3-block model (6 sublayers, 3^6 = 729 precision assignments, each planned): the binary search's plan fits and
    meets QoS, never beats the brute-force optimum, and stays within a small accuracy gap of it."""
    pol = tiny_policy()
    N = pol.ctx.table.n
    for qos in (np.inf, 0.05, 0.03):
        env = pol.env(1, 1, 128, links(-45, -45), pol.ctx.cluster.budgets())
        best, _ = brute_force(pol, env, qos)
        res = pol.search.search([(env, qos)])
        if best is None:
            assert not res.qos_ok
            continue
        assert res.fits and res.qos_ok
        acc = accuracy_proxy(pol.ctx.table.spec.name, pol.ctx.importance, pol.ctx.cfg.accuracy, res.precision,
                             np.zeros(N, int), np.zeros(N))
        assert acc <= best + 1e-9
        assert acc >= best - 0.01 * best


def test_memory_shortage_scales_precision_then_prunes():
    pol = policy("qwen2_5_14b")
    b = pol.ctx.cluster.budgets()
    env_ok = pol.env(1, 1, 256, links(-45, -45), b)
    env_short = pol.env(1, 1, 256, links(-45, -45), b * np.array([1, 0.4, 1]))
    env_none = pol.env(1, 1, 256, links(-45, -99), b * np.array([1, 0.05, 1]))   # watch gone, tablet nearly full
    r_ok = pol.search.search([(env_ok, np.inf)])
    r_short = pol.search.search([(env_short, np.inf)])
    r_none = pol.search.search([(env_none, np.inf)])
    assert r_ok.m < r_short.m and r_ok.prune_frac == 0           # less memory -> lower precision first
    assert r_none.fits and r_none.prune_frac > 0 and r_none.m > r_short.m     # then pruning (m re-searched)
    for r in (r_ok, r_short, r_none):
        assert (r.plans[0].mem_bytes <= r.plans[0].budget_bytes * (1 + 1e-9)).all()
