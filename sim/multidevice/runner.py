"""Drive a multi-device policy through a conversation under an RSSI trace (SimPy; Voltron §4.3 "evaluated token by token").

One SimPy process plays the user: for every turn it asks the policy for the turn's plans (prefill + decode), runs the
prefill (TTFT), then asks the policy before every decode token (it may re-plan: KV growth, RSSI, a device leaving),
runs the token (`execute.step_time` on the links of that instant) and appends a timeline row; between turns the user
thinks for `think_s` while the trace keeps moving. Weight reloads a new plan needs (bytes / device flash bandwidth)
are exposed in full for policies without overlap, and only beyond the step's own time for policies that overlap them
with compute (Voltron §4.3 "Overhead Mitigation"). A policy answering OOM ends the run (`oom` = true).

KV cache lost with a device (`planner.disconnect_kv`): with `prune` (Voltron's default, paper §4.3) the ATTN shards a
departed device held are pruned by the controller together with their KV cache, so nothing is recomputed (the event is
counted in `kv_lost_events`, the accuracy cost shows in the accuracy proxy). With `recompute` (and always for the static
baselines) the KV cache of the ATTN shards a departed device held is gone, and recomputing it needs
the hidden states of every earlier layer, so the cluster re-runs the prefill of the whole cached context on the plan
that replaces it (an upper bound: a system that kept per-layer hidden states could stop at the last lost layer). The
re-prefill time (device roofline, no jitter) is added to the stall of the step that first runs without the device.
Migrating the KV of ATTN shards that move between *live* devices is not modelled (see docs/multidevice.md).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import simpy

from planner.voltron.policy import Decision, Policy, PolicyContext
from planner.voltron.rssi import RssiTable
from planner.voltron.layers import ATTN_GQA, ATTN_MHA, ATTN_SWA
from sim.multidevice.execute import step_time
from sim.multidevice.workload import WorkloadConfig, conversation
from sim.wireless import LinkTracker, RssiTrace


@dataclass
class RunResult:
    metrics: dict
    timeline: list[dict]
    plans: dict | None = None          # plan id -> PhasePlan (every plan adopted during the run)


def _reload_s(ctx: PolicyContext, d: Decision) -> float:
    if d.reload_bytes is None:
        return 0.0
    bw = np.array([dev.storage_gbps * 1e9 for dev in ctx.cluster.devices])   # bytes/s
    return float((d.reload_bytes / bw).max(initial=0.0))


def run_conversation(policy: Policy, ctx: PolicyContext, trace: RssiTrace, rssi: RssiTable, wl: WorkloadConfig,
                     seed: int = 0, jitter: float = 0.03) -> RunResult:
    rng = np.random.default_rng(seed)
    env = simpy.Environment()
    cluster, table, cfg = ctx.cluster, ctx.table, ctx.cfg
    link_names = cluster.spec.links
    budgets = cluster.budgets()
    turns = conversation(wl)
    tracker = LinkTracker(trace, rssi, link_names)
    rows: list[dict] = []
    ttfts: list[float] = []
    plan_ms: list[float] = []
    search_ms: list[float] = []
    st = {"oom": False, "plan_id": 0, "replans": 0, "tokens": 0, "stall": 0.0, "first": True, "energy": 0.0,
          "energy_decode": 0.0, "turns_done": 0, "kv_lost": 0, "kv_recompute_s": 0.0}
    attn = np.isin(table.type_of, [ATTN_MHA, ATTN_GQA, ATTN_SWA])                # (N,) sublayers holding KV
    kv_on = np.zeros(cluster.n, dtype=bool)                                         # devices holding context KV
    prune_kv = policy.name == "voltron" and getattr(cfg, "disconnect_kv", "recompute") == "prune"

    def kv_recompute_s(plan, links, kv: int) -> float:
        """Seconds to rebuild context KV lost with a departed device (re-prefill of `kv` tokens on `plan`), and
        from now on the context KV lives where `plan` keeps its ATTN shards."""
        nonlocal kv_on
        lost = kv > 0 and bool((kv_on & ~links.connected).any())
        kv_on = (plan.shards[attn] > 0).any(axis=0)
        if not lost:
            return 0.0
        if prune_kv:
            st["kv_lost"] += 1          # the policy pruned the departed shards (and their KV): no recompute
            return 0.0
        t, _, _ = step_time(plan, table, cluster, kv, 0, links, rng, 0.0, cfg.head_precision)
        st["kv_lost"] += 1
        st["kv_recompute_s"] += t
        return t

    plans: dict = {}

    def account(d: Decision) -> None:
        if d.replanned or not plans:
            plans[st["plan_id"] + (1 if d.replanned else 0)] = d.plan
        if d.plan_ms > 0:
            plan_ms.append(d.plan_ms)
        if d.searched:
            search_ms.append(d.plan_ms)
        if d.replanned:
            if not st["first"]:
                st["replans"] += 1
            st["first"] = False
            st["plan_id"] += 1

    def row(turn, tok, phase, dt, comm, stall, d: Decision, links, kv, est, plan_id):
        p = d.plan
        prec = np.bincount(p.precision, minlength=3)
        r = {"time_s": env.now, "turn": turn, "token": tok, "phase": phase, "step_s": dt, "comm_s": comm,
             "stall_s": stall, "est_s": est, "plan_id": plan_id, "replanned": bool(d.replanned),
             "n_fp16": int(prec[0]), "n_int8": int(prec[1]), "n_int4": int(prec[2]), "n_tp": p.n_tp,
             "pruned_shards": int(p.pruned.sum()), "act_quantized": int((p.act_precision > 0).sum()),
             "act_pruned": int(p.act_pruned.sum()), "kv_len": kv, "accuracy": policy.accuracy(p),
             "freq_min": float(p.freq.min()) if p.freq.size else 1.0}
        for name, v in zip(link_names, links.rssi_dbm[1:]):
            r[f"rssi_{name}"] = float(v)
        r["connected"] = int(links.connected.sum())
        rows.append(r)

    def user():
        kv = 0
        for turn, (n_in, n_out) in enumerate(turns):
            links = tracker.state(env.now)
            d = policy.start_turn(links, budgets, n_in, kv)
            account(d)
            if d.oom:
                st["oom"] = True
                return
            dt, comm, ej = step_time(d.plan, table, cluster, n_in, kv, links, rng, jitter, cfg.head_precision)
            st["energy"] += ej
            reload = _reload_s(ctx, d)
            stall = max(0.0, reload - dt) if policy.overlap_reload else reload
            stall += kv_recompute_s(d.plan, links, kv)
            ttfts.append(dt + stall)
            row(turn, 0, "prefill", dt + stall, comm, stall, d, links, kv, d.plan.est_time_s, st["plan_id"])
            yield env.timeout(dt + stall)
            kv += n_in
            running, pending, pending_left = None, None, 0.0
            running_id = pending_id = st["plan_id"]              # plan ids of what runs / what is loading
            credit = dt if policy.overlap_reload else 0.0          # loads may proceed during the prefill
            for tok in range(n_out):
                links = tracker.state(env.now)
                d = policy.step(links, budgets, kv)
                account(d)
                if d.oom:
                    st["oom"] = True
                    return
                reload = max(0.0, _reload_s(ctx, d) - credit)
                credit = 0.0
                stall = 0.0
                if running is None or (d.replanned and d.urgent) or not policy.overlap_reload:
                    # the new plan runs now; its missing weights stall the token (beyond the step's own time when
                    # the policy overlaps loads with compute)
                    running, pending = d.plan, None
                    running_id = st["plan_id"]
                elif d.replanned:
                    # background reload: the previous plan keeps running until the new shards are in memory
                    pending, pending_left, pending_id = d.plan, reload, st["plan_id"]
                    reload = 0.0
                dt, comm, ej = step_time(running, table, cluster, 1, kv, links, rng, jitter, cfg.head_precision)
                st["energy"] += ej
                st["energy_decode"] += ej
                if reload:
                    stall = max(0.0, reload - dt) if policy.overlap_reload else reload
                stall += kv_recompute_s(running, links, kv)
                shown = Decision(plan=running, replanned=d.replanned)
                row(turn, tok + 1, "decode", dt + stall, comm, stall, shown, links, kv, running.est_time_s, running_id)
                st["tokens"] += 1
                yield env.timeout(dt + stall)
                if pending is not None:
                    pending_left -= dt + stall
                    if pending_left <= 0:
                        running, pending, running_id = pending, None, pending_id
                kv += 1
            st["turns_done"] += 1
            yield env.timeout(wl.think_s)

    env.process(user())
    env.run()
    return RunResult(_metrics(rows, ttfts, plan_ms, search_ms, st, cfg, turns), rows, plans)


def _metrics(rows, ttfts, plan_ms, search_ms, st, cfg, turns) -> dict:
    dec = [r for r in rows if r["phase"] == "decode"]
    tpot = np.array([r["step_s"] for r in dec]) * 1e3                      # ms
    acc = np.array([r["accuracy"] for r in dec]) if dec else np.array([])
    requested = sum(o for _, o in turns)

    def f(x):
        return None if x is None or not np.isfinite(x) else float(x)

    return {
        "ttft_s": f(np.mean(ttfts)) if ttfts else None,
        "ttft_s_max": f(np.max(ttfts)) if ttfts else None,
        "qos_ttft_ok": bool(ttfts) and bool(np.max(ttfts) <= cfg.qos_ttft_s) and not st["oom"],
        "tpot_ms_p50": f(np.percentile(tpot, 50)) if tpot.size else None,
        "tpot_ms_p99": f(np.percentile(tpot, 99)) if tpot.size else None,
        "qos_tpot_violation_rate": f((tpot > cfg.qos_tpot_s * 1e3).mean()) if tpot.size else None,
        "accuracy_proxy": f(acc.mean()) if acc.size else None,
        "replans": int(st["replans"]),
        "plan_ms_p50": f(np.median(plan_ms)) if plan_ms else None,
        "plan_ms_max": f(np.max(plan_ms)) if plan_ms else None,
        "plan_searches": len(search_ms),
        "plan_ms_p50_search": f(np.median(search_ms)) if search_ms else None,
        "oom": bool(st["oom"]),
        "tokens_generated": int(st["tokens"]),
        "tokens_requested": int(requested),
        "stall_s_total": f(sum(r["stall_s"] for r in rows)),
        "energy_j": f(st["energy"]),
        "energy_mj_per_token": f(1e3 * st["energy_decode"] / st["tokens"]) if st["tokens"] else None,
        "turns_completed": int(st["turns_done"]),
        "kv_lost_events": int(st["kv_lost"]),
        "kv_recompute_s_total": f(st["kv_recompute_s"]),
    }


def simulate(spec, cluster_spec, pcfg, tcfg, wl: WorkloadConfig, rssi: RssiTable, seed: int = 0,
             jitter: float = 0.03) -> RunResult:
    """Everything one `experiments.multidevice` run does: resolve devices, fit the latency model on simulated
    profiles, load importance and the trace, build the policy, run the conversation. Adds the latency-model accuracy
    and the run identity to the metrics."""
    from planner.voltron.devices import Cluster, load_device
    from planner.voltron.registry import build_context, make_policy

    cluster = Cluster(cluster_spec, [load_device(d) for d in cluster_spec.devices])
    trace = RssiTrace.load(tcfg)
    trace.rssi(cluster_spec.links, 0.0)                                      # every cluster link must be in the trace
    ctx, acc = build_context(spec, cluster, pcfg, seed)
    policy = make_policy(ctx)
    res = run_conversation(policy, ctx, trace, rssi, wl, seed, jitter)
    res.metrics.update({
        "latency_model_accuracy": acc["accuracy"], "latency_model_mape": acc["mape"], "latency_model_r2": acc["r2"],
        "importance_source": ctx.importance.source, "planner": pcfg.name + ("" if pcfg.name in ("voltron", "single")
                                                                            else f"-{pcfg.balance}"),
        "cluster": cluster_spec.name, "model": spec.name, "trace": tcfg.name,
    })
    return res


MEASURED_KEYS = ["plan_ms_p50", "plan_ms_max", "plan_ms_p50_search"]
MODELLED_KEYS = ["ttft_s", "ttft_s_max", "qos_ttft_ok", "tpot_ms_p50", "tpot_ms_p99", "qos_tpot_violation_rate",
                 "accuracy_proxy", "replans", "oom", "tokens_generated", "tokens_requested", "stall_s_total",
                 "energy_j", "energy_mj_per_token", "plan_searches",
                 "turns_completed", "kv_lost_events", "kv_recompute_s_total", "latency_model_accuracy",
                 "latency_model_mape", "latency_model_r2", "importance_source"]
