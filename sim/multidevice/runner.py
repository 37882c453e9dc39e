"""Drive a multi-device policy through a conversation under an RSSI trace (SimPy; Voltron §4.3 "token by token").

One SimPy process plays the user: for every turn it asks the policy for the turn's plans (prefill + decode), runs the
prefill (TTFT), then asks the policy before every decode token (it may re-plan: KV growth, RSSI, a device leaving),
runs the token on the simulated cluster (`device_model.GroundTruth`, on the links of that instant) and appends a
timeline row; between turns the user thinks for `think_s` while the trace keeps moving. Weight reloads a new plan
needs (bytes / device flash bandwidth) are exposed in full for policies without overlap, and only beyond the step's
own time for policies that overlap them with compute (Voltron §4.3 "Overhead Mitigation"). A policy answering OOM
ends the run (`oom` = true).

KV cache lost with a device: the policy declares how it handles it (`Policy.lost_kv()`, a capability of the policy
class, never its name). `prune` (Voltron with `planner.disconnect_kv=prune`, its default, paper §4.3): the ATTN shards
a departed device held are pruned by the controller together with their KV cache, so nothing is recomputed (the event
is counted in `kv_lost_events`, the accuracy cost shows in the accuracy proxy). `recompute` (Voltron with
`disconnect_kv=recompute`; the static baselines, which have no pruning): the KV cache of the ATTN shards a departed
device held is gone, and recomputing it needs the hidden states of every earlier layer, so the cluster re-runs the
prefill of the whole cached context on the plan that replaces it (an upper bound: a system that kept per-layer hidden
states could stop at the last lost layer). The
re-prefill time (simulated cluster, no jitter) is added to the stall of the step that first runs without the device.
Migrating the KV of ATTN shards that move between *live* devices is not modelled (see docs/multidevice.md).

KV of restored shards: a plan that runs ATTN shards the plan before it had pruned (a bridge lifted, a device back, a
re-plan that prunes less; `planner.voltron.policy.restores_kv`) has no KV for them; the cluster re-prefills the cached
context on the new plan before its first step, and so does the simulator (`kv_rebuild_s_total`, `kv_rebuilds`).
A switch the policy makes when a turn is answered (`Policy.end_turn`) reloads and rebuilds during the user's think
time; what does not fit in it stalls the next prefill.

Bridges (`Decision.bridge`): the running plan with the policy's no-reload levers runs until the re-planned placement
has loaded; from then on the loaded placement runs, and a bridge of the plan it replaced (`Decision.bridge_of`) is not
put back. A re-plan that needs nothing beyond a placement still loading waits for that load. A row's `est_s` is the
policy's estimate of that step (`Policy.estimate`: the plan that ran, re-costed for the step's links and KV length).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import simpy

from planner.voltron.layers import ATTN_GQA, ATTN_MHA, ATTN_SWA
from planner.voltron.policy import Decision, Policy, PolicyContext, restores_kv
from planner.voltron.rssi import RssiTable
from sim.multidevice.device_model import GroundTruth, TruthAssumptions, profiler
from sim.multidevice.squeeze import Squeeze
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


class _Conversation:
    """State of one simulated conversation; `user` is the SimPy process (see the module docstring)."""

    def __init__(self, policy: Policy, ctx: PolicyContext, trace: RssiTrace, rssi: RssiTable, wl: WorkloadConfig,
                 seed: int, jitter: float, truth: TruthAssumptions | None = None,
                 squeeze: Squeeze | None = None):
        self.policy, self.ctx, self.wl, self.jitter = policy, ctx, wl, jitter
        self.squeeze = squeeze or Squeeze.none()
        self.squeeze.check(ctx.cluster.n, trace.name)
        self.truth = GroundTruth(ctx.cluster, ctx.table, ctx.cfg.head_precision, truth)   # the simulated cluster
        self.rng = np.random.default_rng(seed)
        self.env = simpy.Environment()
        self.cluster, self.table, self.cfg = ctx.cluster, ctx.table, ctx.cfg
        self.link_names = self.cluster.spec.links
        self.budgets = self.cluster.budgets()
        self.turns = conversation(wl)
        self.tracker = LinkTracker(trace, rssi, self.link_names)
        self.rows: list[dict] = []
        self.ttfts: list[float] = []
        self.plan_ms: list[float] = []
        self.search_ms: list[float] = []
        self.plans: dict = {}                                                     # plan id -> PhasePlan
        # plan ids: `next_id` numbers every plan adopted (the policy's plans and bridges), `plan_id` is the id of the
        # policy's current plan (a bridge runs under its own id while the policy's plan loads)
        self.st = {"oom": False, "plan_id": 0, "next_id": 0, "replans": 0, "tokens": 0, "stall": 0.0, "first": True,
                   "energy": 0.0, "energy_decode": 0.0, "turns_done": 0, "kv_lost": 0, "kv_recompute_s": 0.0,
                   "kv_rebuilds": 0, "kv_rebuild_s": 0.0}
        self.attn = np.isin(self.table.type_of, [ATTN_MHA, ATTN_GQA, ATTN_SWA])   # (N,) sublayers holding KV
        self.kv_on = np.zeros(self.cluster.n, dtype=bool)                         # devices holding context KV
        self.prune_kv = policy.lost_kv() == "prune"                               # a declared capability
        self.ran = None                                                           # the plan of the last step
        self.idle_left = 0.0                      # s of an end-of-turn switch still running when the prompt came

    def step_time(self, plan, n_tokens: int, kv: int, links, jitter: float,
                  observe: bool = True) -> tuple[float, float, float]:
        """Run one step on the simulated cluster (the scenario's squeeze of this instant applied) and report
        what the cluster measured to the policy (`Policy.observe`): (seconds, of which communication, joules)."""
        sq = self.squeeze.at(self.cluster.n, self.env.now)
        slow, real = (None, links) if sq is None else (sq[0], Squeeze.links(links, sq[1]))
        t, comm, energy, busy, link_s = self.truth.step_detail(plan, n_tokens, kv, real, self.rng, jitter, slow)
        if observe:                          # (not the runner's own costing of a KV re-prefill)
            self.policy.observe(plan, n_tokens, kv, links, t, busy, link_s)
        return t, comm, energy

    def kv_recompute_s(self, plan, links, kv: int) -> float:
        """Seconds to rebuild context KV before `plan` runs its step (re-prefill of `kv` tokens on `plan`): KV lost
        with a departed device, or the KV of ATTN shards the previous step's plan had pruned; from now on the context
        KV lives where `plan` keeps its ATTN shards."""
        lost = kv > 0 and bool((self.kv_on & ~links.connected).any())
        self.kv_on = (plan.shards[self.attn] > 0).any(axis=0)
        prev, self.ran = self.ran, plan
        if lost:
            self.st["kv_lost"] += 1
        if lost and not self.prune_kv:
            t, _, _ = self.step_time(plan, kv, 0, links, 0.0, observe=False)
            self.st["kv_recompute_s"] += t
            return t
        # (prune: the policy pruned the departed shards and their KV; nothing to recompute for them)
        if kv <= 0 or prev is None or not restores_kv(self.table, prev, plan):
            return 0.0
        t, _, _ = self.step_time(plan, kv, 0, links, 0.0, observe=False)
        self.st["kv_rebuilds"] += 1
        self.st["kv_rebuild_s"] += t
        return t

    def account(self, d: Decision) -> None:
        st = self.st
        if d.replanned or not self.plans:
            self.plans[st["next_id"] + (1 if d.replanned else 0)] = d.plan
        if d.plan_ms > 0:
            self.plan_ms.append(d.plan_ms)
        if d.searched:
            self.search_ms.append(d.plan_ms)
        if d.replanned:
            if not st["first"]:
                st["replans"] += 1
            st["first"] = False
            st["next_id"] += 1
            st["plan_id"] = st["next_id"]

    def row(self, turn, tok, phase, dt, comm, stall, d: Decision, links, kv, est, plan_id) -> None:
        p = d.plan
        prec = np.bincount(p.precision, minlength=3)
        r = {"time_s": self.env.now, "turn": turn, "token": tok, "phase": phase, "step_s": dt, "comm_s": comm,
             "stall_s": stall, "est_s": est, "plan_id": plan_id, "replanned": bool(d.replanned),
             "n_fp16": int(prec[0]), "n_int8": int(prec[1]), "n_int4": int(prec[2]), "n_tp": p.n_tp,
             "pruned_shards": int(p.pruned.sum()), "act_quantized": int((p.act_precision > 0).sum()),
             "act_pruned": int(p.act_pruned.sum()), "kv_len": kv, "accuracy": self.policy.accuracy(p),
             "freq_min": float(p.freq.min()) if p.freq.size else 1.0}
        for name, v in zip(self.link_names, links.rssi_dbm[1:]):
            r[f"rssi_{name}"] = float(v)
        r["connected"] = int(links.connected.sum())
        self.rows.append(r)

    def prefill(self, turn: int, n_in: int, kv: int):
        """Turn start: plan, run the prefill (TTFT). Returns (step seconds, stall seconds) or None on OOM."""
        links = self.tracker.state(self.env.now)
        d = self.policy.start_turn(links, self.budgets, n_in, kv)
        self.account(d)
        if d.oom:
            self.st["oom"] = True
            return None
        dt, comm, ej = self.step_time(d.plan, n_in, kv, links, self.jitter)
        self.st["energy"] += ej
        reload = _reload_s(self.ctx, d)
        stall = max(0.0, reload - dt) if self.policy.overlap_reload else reload
        stall += self.kv_recompute_s(d.plan, links, kv) + self.idle_left
        self.idle_left = 0.0
        self.ttfts.append(dt + stall)
        self.row(turn, 0, "prefill", dt + stall, comm, stall, d, links, kv, d.plan.est_time_s, self.st["plan_id"])
        return dt, stall

    def decode(self, turn: int, n_out: int, kv: int, prefill_s: float):
        """The decode tokens of one turn (SimPy generator). Plans being loaded in the background (`pending`) replace
        the running plan once their shards are in memory."""
        policy, st = self.policy, self.st
        running, pending, pending_left = None, None, 0.0
        base = None                                          # the loaded policy plan `running` is (or bridges)
        running_id = pending_id = st["plan_id"]              # plan ids of what runs / what is loading
        credit = prefill_s if policy.overlap_reload else 0.0   # loads may proceed during the prefill
        for tok in range(n_out):
            links = self.tracker.state(self.env.now)
            d = policy.step(links, self.budgets, kv)
            self.account(d)
            if d.oom:
                st["oom"] = True
                return
            reload = max(0.0, _reload_s(self.ctx, d) - credit)
            credit = 0.0
            stall = 0.0
            if running is None or (d.replanned and d.urgent) or not policy.overlap_reload:
                # the new plan runs now; its missing weights stall the token (beyond the step's own time when
                # the policy overlaps loads with compute)
                running, pending, base = d.plan, None, d.plan
                running_id = st["plan_id"]
            elif d.replanned:
                # background reload: the previous plan keeps running until the new shards are in memory; a plan that
                # needs nothing beyond the one still loading (the policy counts that one as resident) waits for it
                left = pending_left if pending is not None and reload <= 0 else reload
                pending, pending_left, pending_id = d.plan, left, st["plan_id"]
                reload = 0.0
            if d.bridge is not None and d.bridge is not running and (d.bridge_of is None or d.bridge_of is base):
                # the running plan with the run-time levers that need no reload, until the pending plan is loaded
                # (a bridge of a plan the loaded placement has since replaced is void)
                st["next_id"] += 1
                st["replans"] += 1
                self.plans[st["next_id"]] = d.bridge
                running, running_id = d.bridge, st["next_id"]
            dt, comm, ej = self.step_time(running, 1, kv, links, self.jitter)
            st["energy"] += ej
            st["energy_decode"] += ej
            if reload:
                stall = max(0.0, reload - dt) if policy.overlap_reload else reload
            stall += self.kv_recompute_s(running, links, kv)
            shown = Decision(plan=running, replanned=d.replanned)
            # the planner's estimate of this step: the plan re-costed for its links and KV length (a plan kept over
            # several steps, a bridge above all, was costed for the links it was made on)
            est = policy.estimate(running, 1, kv, links).est_time_s
            self.row(turn, tok + 1, "decode", dt + stall, comm, stall, shown, links, kv, est,
                     running_id)
            st["tokens"] += 1
            yield self.env.timeout(dt + stall)
            if pending is not None:
                pending_left -= dt + stall
                if pending_left <= 0:
                    running, pending, running_id, base = pending, None, pending_id, pending
            kv += 1

    def user(self):
        kv = 0
        for turn, (n_in, n_out) in enumerate(self.turns):
            out = self.prefill(turn, n_in, kv)
            if out is None:
                return
            dt, stall = out
            yield self.env.timeout(dt + stall)
            kv += n_in
            yield from self.decode(turn, n_out, kv, dt)
            if self.st["oom"]:
                return
            kv += n_out
            self.st["turns_done"] += 1
            self.end_turn(kv)
            yield self.env.timeout(self.wl.think_s)

    def end_turn(self, kv: int) -> None:
        """The policy's switch while the user thinks: its reload and KV rebuild run in the think time; the rest
        stalls the next prefill."""
        links = self.tracker.state(self.env.now)
        d = self.policy.end_turn(links, self.budgets, kv, self.wl.think_s)
        if d is None or d.oom:
            return
        self.account(d)
        busy = _reload_s(self.ctx, d) + self.kv_recompute_s(d.plan, links, kv)
        self.idle_left = max(0.0, busy - self.wl.think_s)

    def run(self) -> RunResult:
        self.env.process(self.user())
        self.env.run()
        return RunResult(_metrics(self.rows, self.ttfts, self.plan_ms, self.search_ms, self.st, self.cfg, self.turns),
                         self.rows, self.plans)


def run_conversation(policy: Policy, ctx: PolicyContext, trace: RssiTrace, rssi: RssiTable, wl: WorkloadConfig,
                     seed: int = 0, jitter: float = 0.03, truth: TruthAssumptions | None = None,
                     squeeze: Squeeze | None = None) -> RunResult:
    """Simulate one conversation of `policy` under `trace` (and the scenario's `squeeze`, none if None) on
    the simulated cluster (`device_model.GroundTruth` with `truth`, default assumptions if None); deterministic for a
    seed."""
    return _Conversation(policy, ctx, trace, rssi, wl, seed, jitter, truth, squeeze).run()


PREC_NAMES = ("FP16", "INT8", "INT4")


def _precision_run(rows: list[dict]) -> dict:
    """Weight precision the planner chose, over the decode steps (the prefill steps if there are none): shares of
    sublayer-steps at FP16 / INT8 / INT4 and a label — `INT8` (one uniform precision throughout), `INT8/INT4`
    (uniform, changed between re-plans, in order of first use) or `mixed` (per-sublayer mixed precision)."""
    use = [r for r in rows if r["phase"] == "decode"] or rows
    if not use:
        return {"precision": None, "precision_share_fp16": None, "precision_share_int8": None,
                "precision_share_int4": None}
    n = np.array([[r["n_fp16"], r["n_int8"], r["n_int4"]] for r in use], dtype=float)    # (steps, 3)
    share = n.sum(axis=0) / n.sum()
    uniform = (n > 0).sum(axis=1) == 1
    if uniform.all():
        seen: list[str] = []
        for i in n.argmax(axis=1):
            if PREC_NAMES[i] not in seen:
                seen.append(PREC_NAMES[i])
        label = "/".join(seen)
    else:
        label = "mixed"
    return {"precision": label, "precision_share_fp16": float(share[0]), "precision_share_int8": float(share[1]),
            "precision_share_int4": float(share[2])}


def _prediction_error(rows: list[dict]) -> dict:
    """The planner's prediction error against the simulator, per phase: relative error (est − simulated) / simulated
    of every prefill (TTFT without reload / KV stalls, which the planner does not predict) and decode step; `mape` is
    the mean |error|, `bias` the mean signed error (> 0: the planner over-estimates)."""
    out = {}
    for phase, key in (("prefill", "ttft"), ("decode", "tpot")):
        est = np.array([r["est_s"] for r in rows if r["phase"] == phase], dtype=float)
        sim = np.array([r["step_s"] - r["stall_s"] for r in rows if r["phase"] == phase], dtype=float)
        ok = np.isfinite(est) & (sim > 0)
        err = (est[ok] - sim[ok]) / sim[ok]
        out[f"pred_err_{key}_mape"] = float(np.abs(err).mean()) if err.size else None
        out[f"pred_err_{key}_bias"] = float(err.mean()) if err.size else None
    return out


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
        "kv_rebuilds": int(st["kv_rebuilds"]),
        "kv_rebuild_s_total": f(st["kv_rebuild_s"]),
        **_precision_run(rows),
        **_prediction_error(rows),
    }


def build_run_context(spec, cluster, pcfg, seed: int = 0, truth: TruthAssumptions | None = None):
    """(PolicyContext, latency-model accuracy) for a run on the simulated cluster: the planner's regression is fitted
    on profiling runs of the simulated devices (`device_model.profiler`). Every simulated run should build its
    context here (report, sensitivity, figures), not with the spec-roofline default of `build_context`."""
    from planner.voltron.registry import build_context

    return build_context(spec, cluster, pcfg, seed, profiler=profiler(cluster, truth, pcfg.head_precision))


def simulate(spec, cluster_spec, pcfg, tcfg, wl: WorkloadConfig, rssi: RssiTable, seed: int = 0,
             jitter: float = 0.03, truth: TruthAssumptions | None = None) -> RunResult:
    """Everything one `experiments.multidevice` run does: resolve devices, profile the simulated cluster's devices
    and fit the planner's latency model on the profiles, load importance and the trace, build the policy, run the
    conversation on the simulated cluster. Adds the latency-model accuracy and the run identity to the metrics."""
    from planner.voltron.devices import Cluster, load_device
    from planner.voltron.registry import make_policy

    cluster = Cluster(cluster_spec, [load_device(d) for d in cluster_spec.devices])
    trace = RssiTrace.load(tcfg)
    trace.rssi(cluster_spec.links, 0.0)                                      # every cluster link must be in the trace
    ctx, acc = build_run_context(spec, cluster, pcfg, seed, truth)
    policy = make_policy(ctx)
    squeeze = Squeeze.load(tcfg)
    res = run_conversation(policy, ctx, trace, rssi, wl, seed, jitter, truth, squeeze)
    res.metrics.update({
        "latency_model_accuracy": acc["accuracy"], "latency_model_mape": acc["mape"], "latency_model_r2": acc["r2"],
        "importance_source": ctx.importance.source, "planner": policy.label(),
        "cluster": cluster_spec.name, "model": spec.name, "trace": tcfg.name,
    })
    return res


MEASURED_KEYS = ["plan_ms_p50", "plan_ms_max", "plan_ms_p50_search"]
MODELLED_KEYS = ["ttft_s", "ttft_s_max", "qos_ttft_ok", "tpot_ms_p50", "tpot_ms_p99", "qos_tpot_violation_rate",
                 "accuracy_proxy", "replans", "oom", "tokens_generated", "tokens_requested", "stall_s_total",
                 "energy_j", "energy_mj_per_token", "plan_searches",
                 "turns_completed", "kv_lost_events", "kv_recompute_s_total", "kv_rebuilds", "kv_rebuild_s_total",
                 "latency_model_accuracy",
                 "latency_model_mape", "latency_model_r2", "importance_source", "precision", "precision_share_fp16",
                 "precision_share_int8", "precision_share_int4",
                 "pred_err_ttft_mape", "pred_err_ttft_bias", "pred_err_tpot_mape", "pred_err_tpot_bias"]
