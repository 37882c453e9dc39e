"""Re-plan benchmark (Voltron §4.3: "the model execution plan module … less than a few hundred microseconds"; target:
median re-plan for Qwen2.5-14B on a 3-device cluster ≤ 1 ms, i.e. < 1 % of a 400 ms TPOT), against a brute-force
enumeration of every precision assignment on a small model, measured in the same run. The token-level re-plans must
also be steady (p90 ≤ 2 × median and ≤ 2 ms): a re-plan that prunes shards builds an option table per pruned fraction
it tries, and those must not make the tail.

Prints a table and writes outputs/bench/replan.json.
"""
from __future__ import annotations

import time

import numpy as np
import pytest

from quant.atomic import atomic_write_json
from tests.conftest import REPO
from tests.voltron.helpers import brute_force, links, policy, tiny_policy

pytestmark = pytest.mark.bench

TRAJ_PASSES = 5            # the token trajectory is replayed this often, all re-plans pooled (200 samples for the p90)
TARGET_P90_OVER_MEDIAN = 2.0
TARGET_P90_MS = 2.0


def _median_ms(fn, envs, reps=1, clock=time.perf_counter):
    ts = []
    for e in envs:
        for _ in range(reps):
            t0 = clock()
            fn(e)
            ts.append((clock() - t0) * 1e3)
    return float(np.median(ts)), float(np.percentile(ts, 90))


def _cpu_ms_per_call(fn, envs, reps=3):
    """Process CPU time per call over the whole list (the host is shared: wall time includes waiting for a core)."""
    best = np.inf
    for _ in range(reps):
        t0 = time.process_time()
        for e in envs:
            fn(e)
        best = min(best, (time.process_time() - t0) * 1e3 / len(envs))
    return float(best)


def test_replan_benchmark():
    rng = np.random.default_rng(0)
    pol = policy("qwen2_5_14b", "office")
    hp, search = pol.hp, pol.search
    qos = pol.ctx.cfg.qos_tpot_s * (1 - pol.ctx.cfg.qos_margin)
    envs = [pol.env(1, 1, int(rng.integers(0, 6000)), links(*rng.uniform(-78, -40, 2)), pol.ctx.cluster.budgets())
            for _ in range(40)]
    for e in envs[:3]:
        search.search([(e, qos)])                                        # warm-up (imports, allocator)

    def cold(e):                                                          # nothing cached: rebuild all option tables
        hp.clear_tables()
        return search.search([(e, qos)])

    def warm(e):                                                          # tables cached: the precision search alone
        return search.search([(e, qos)])

    def single_plan(e):
        return hp.plan(e, search.precision_at(search.m_max // 2))

    # token-by-token trajectory: the walk-away (RSSI -40 -> -78 dBm) while the KV cache grows, each re-plan warm-started
    # from the previous solution (demotion index and pruned fraction) as the controller does
    traj = [pol.env(1, 1, 64 * i, links(-40 - i, -40 - 0.2 * i), pol.ctx.cluster.budgets()) for i in range(40)]
    last = [None, None]

    def token_replan(e):                                                  # KV bucket and RSSI both moved: rebuild
        hp.clear_tables()
        r = search.search([(e, qos)], hint=last[0], prune_hint=last[1])
        last[:] = r.m, r.prune_frac
        return r

    traj_ts, traj_cpu_ts, pruned_tokens = [], [], 0
    for _ in range(TRAJ_PASSES):                                          # each pass starts without a previous plan
        last[:] = None, None
        for e in traj:
            t0, c0 = time.perf_counter(), time.thread_time()
            r = token_replan(e)
            traj_ts.append((time.perf_counter() - t0) * 1e3)
            traj_cpu_ts.append((time.thread_time() - c0) * 1e3)       # the re-plan's own CPU time (no waiting)
            pruned_tokens += r.prune_frac > 0
    traj_ms = float(np.median(traj_ts)), float(np.percentile(traj_ts, 90))
    traj_cpu_ms = float(np.median(traj_cpu_ts)), float(np.percentile(traj_cpu_ts, 90))
    last[:] = None, None
    traj_cpu = _cpu_ms_per_call(token_replan, traj)
    cold_ms = _median_ms(cold, envs)
    warm_ms = _median_ms(warm, envs, reps=3)
    plan_ms = _median_ms(single_plan, envs, reps=3)
    steps = float(np.mean([warm(e).steps for e in envs]))

    # brute force vs binary search on a 3-block model (6 sublayers, 3^6 = 729 precision assignments)
    tiny = tiny_policy()
    tenv = tiny.env(1, 1, 128, links(-45, -45), tiny.ctx.cluster.budgets())
    tq = 0.05
    t0 = time.perf_counter()
    best, _ = brute_force(tiny, tenv, tq)
    brute_ms = (time.perf_counter() - t0) * 1e3
    tiny.hp.clear_tables()
    t0 = time.perf_counter()
    res = tiny.search.search([(tenv, tq)])
    tiny_ms = (time.perf_counter() - t0) * 1e3
    from planner.voltron.accuracy import accuracy_proxy

    N = tiny.ctx.table.n
    acc = accuracy_proxy(tiny.ctx.table.spec.name, tiny.ctx.importance, tiny.ctx.cfg.accuracy, res.precision,
                         np.zeros(N, int), np.zeros(N))

    tpot_ms = pol.ctx.cfg.qos_tpot_s * 1e3
    out = {
        "model": "qwen2_5_14b", "cluster": "office", "sublayers": pol.ctx.table.n, "envs": len(envs),
        "replan_token_ms_p50": traj_ms[0], "replan_token_ms_p90": traj_ms[1],
        "replan_token_p90_over_median": traj_ms[1] / traj_ms[0], "replan_token_samples": len(traj_ts),
        "replan_token_pruned_share": pruned_tokens / len(traj_ts),
        "replan_token_thread_cpu_ms_p50": traj_cpu_ms[0], "replan_token_thread_cpu_ms_p90": traj_cpu_ms[1],
        "target_token_p90_over_median_met": traj_ms[1] <= TARGET_P90_OVER_MEDIAN * traj_ms[0],
        "target_token_p90_ms_met": traj_ms[1] <= TARGET_P90_MS,
        "target_1ms_met_token": traj_ms[0] <= 1.0, "replan_token_cpu_ms_mean": traj_cpu,
        "replan_cold_ms_p50": cold_ms[0], "replan_cold_ms_p90": cold_ms[1],
        "replan_warm_ms_p50": warm_ms[0], "replan_warm_ms_p90": warm_ms[1],
        "single_plan_ms_p50": plan_ms[0], "search_steps_mean": steps,
        "replan_cold_share_of_tpot": cold_ms[0] / tpot_ms, "target_1ms_met_cold": cold_ms[0] <= 1.0,
        "target_1ms_met_warm": warm_ms[0] <= 1.0,
        "tiny_bruteforce_ms": brute_ms, "tiny_search_ms": tiny_ms, "tiny_speedup": brute_ms / tiny_ms,
        "host_loadavg_1min": __import__("os").getloadavg()[0],
        "tiny_bruteforce_accuracy": best, "tiny_search_accuracy": acc, "tiny_assignments": 3 ** N,
    }
    print("\nre-plan benchmark (measured on this host, same run)")
    print(f"{'what':48s} {'median ms':>10s} {'p90 ms':>8s}")
    print(f"{'Qwen2.5-14B/office token re-plan (warm start)':48s} {traj_ms[0]:10.3f} {traj_ms[1]:8.3f}")
    print(f"{'  same, thread CPU time of each re-plan (pooled)':48s} {traj_cpu_ms[0]:10.3f} {traj_cpu_ms[1]:8.3f}")
    print(f"{'  same, process CPU time per re-plan (best of 3)':48s} {traj_cpu:10.3f}")
    print(f"{'Qwen2.5-14B/office re-plan, tables rebuilt':48s} {cold_ms[0]:10.3f} {cold_ms[1]:8.3f}")
    print(f"{'Qwen2.5-14B/office re-plan, tables cached':48s} {warm_ms[0]:10.3f} {warm_ms[1]:8.3f}")
    print(f"{'one hybrid plan (no search)':48s} {plan_ms[0]:10.3f} {plan_ms[1]:8.3f}")
    print(f"token re-plan p90 / median: {traj_ms[1] / traj_ms[0]:.2f} (target ≤ {TARGET_P90_OVER_MEDIAN:g}), p90 "
          f"{traj_ms[1]:.3f} ms (target ≤ {TARGET_P90_MS:g}); {len(traj_ts)} re-plans, "
          f"{100 * pruned_tokens / len(traj_ts):.0f} % of them prune shards")
    print(f"host load average (1 min): {out['host_loadavg_1min']:.1f} on {__import__('os').cpu_count()} cores")
    print(f"share of a 400 ms TPOT (rebuilt): {100 * cold_ms[0] / tpot_ms:.3f} %; binary-search steps {steps:.1f}")
    print(f"tiny model: brute force {brute_ms:.1f} ms over {3 ** N} assignments vs search {tiny_ms:.3f} ms "
          f"({brute_ms / tiny_ms:.0f}x); accuracy {best} vs {acc}")
    atomic_write_json(REPO / "outputs" / "bench" / "replan.json", out)
    assert res.fits and best is not None and acc <= best + 1e-9
    assert tiny_ms < brute_ms                                    # ratio measured in the same run
