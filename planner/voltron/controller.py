"""Voltron's elastic controller (paper §4.2–4.3), evaluated turn by turn and token by token.

- Turn start: communication scaling, then importance-aware mixed precision by binary search (`precision.py`) over the
  prefill *and* decode plans together (both QoS targets, every device's memory), each step re-running the hybrid
  MP/TP planner (`hybrid.py`).
- Every decode token: the controller observes the KV length, the links (RSSI → goodput/latency) and which devices are
  reachable. Plans are valid for a KV bucket, a link state and the closed loop's corrections, so it re-plans only when
  one of them changes (a cache hit otherwise); a re-plan is the same search on the decode phase, which yields, in the
  paper's order:
    * communication scaling first (§4.3.2, footnote 5): the search runs with the transferred activations at FP16, at
      INT8 and at INT4 (when the plan communicates); the most accurate result that meets the targets is kept;
    * computation scaling (§4.3.1): memory short (KV growth, a device left) or QoS missed → lower precision of the
      least important layers first; if all-INT4 still does not fit or meet the TPOT target → prune the same fraction
      of shards from every layer;
    * restoration: the search always starts from FP16, so precision and shards come back as soon as memory or links
      allow it (KV flush, device back);
    * the parallel strategy follows the links: with weak RSSI the planner's communication term moves FFN layers from
      TP to MP (paper Fig. 8b).
  If communication still breaks the target after the search, the activations of TP layers are pruned with their
  remote shards, least important first.
- Closed loop (`feedback.py`): every executed step is compared with the models' estimate of it; per-device compute
  and per-link message corrections re-scale the latency / communication models, and the targets are QoS over the
  margin of the observed error's `planner.feedback.percentile` (p99). A step above the TPOT QoS forces a re-plan at
  the next token. While a re-planned placement loads in the background and the running plan breaks the target, the
  levers that need no reload act on the running plan in the same step (`bridge`): communication scaling, then
  pruning; precision is the re-planned placement itself. The bridge is re-costed on every step's links (more levers
  when it breaks the target) and names the plan it was made of (`Decision.bridge_of`): once the re-planned
  placement has loaded, the runtime runs it and a bridge of the replaced plan is void; that placement keeps the
  bridge's ATTN pruning unless their KV rebuild fits in the step (`_hold_for_bridge`).
- Decode plans reserve the KV cache one bucket ahead, so the placement the next bucket needs is found while the
  running plan still fits and loads in the background.
- Disconnects (`disconnect_kv=prune`, default; paper §4.3): the share of the running plan's ATTN shards a departed
  device held (their KV left with it) becomes a floor on the search's pruned fraction until the device is back, so
  generation continues without recomputing KV; the search may prune more (`compute_pruning`) or lower precision to
  meet the TPOT QoS on the remaining devices, and restores the shards (background reload) when the device returns.
- Reloads: a new plan returns the bytes each device must load from flash; with `overlap_reload` the simulator hides
  them behind compute (§4.3 "Overhead Mitigation").
- Restoring pruned ATTN shards (a bridge lifted, a device back, a re-plan that prunes less) has a one-time cost the
  planner charges: those shards have no KV for the cached context, and recomputing it is a re-prefill of the context
  on the new plan (`restores_kv`, `kv_rebuild_s`, estimated with the prefill regression and its corrections). A
  restore is taken only when the step that pays it still meets the target; otherwise the new plan keeps the ATTN
  pruning of the plan that ran (`_hold_kv`: its other levers — FFN shards, precision — still come back; or the plan
  that ran itself, when that is the more accurate of the two) and the
  shards return at a later step that can pay for them: at a turn start, where the rebuild counts against the TTFT
  target, or while the cluster waits for the user's next prompt (`end_turn`, the rebuild runs in the idle time)
  (paper §4.3.2: pruned activations are restored gradually; §4.3.1: plans follow the newly estimated execution
  time). No token is planned above the target to pay for a restore.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from planner.voltron.comm import LinkState
from planner.voltron.feedback import Observation, QosFeedback
from planner.voltron.layers import ATTN_GQA, ATTN_MHA, ATTN_SWA
from planner.voltron.options import PhaseEnv
from planner.voltron.plan import TP, PhasePlan
from planner.voltron.policy import Decision, Policy, PolicyContext, restores_kv, timed
from planner.voltron.precision import PrecisionSearch

UNBOUNDED_B = 1e15        # bytes: budget of a cost-only estimate (the plan's memory was checked when it was made)


class VoltronPolicy(Policy):
    name = "voltron"

    def __init__(self, ctx: PolicyContext):
        super().__init__(ctx)
        self.overlap_reload = ctx.cfg.overlap_reload
        self.order = ctx.importance.order()
        self.search = PrecisionSearch(self.hp, ctx.importance.per_sublayer, prune_steps=ctx.cfg.prune_steps,
                                      compute_pruning=ctx.cfg.compute_pruning)
        tb = ctx.table
        self._attn = np.isin(tb.type_of, [ATTN_MHA, ATTN_GQA, ATTN_SWA])       # sublayers holding KV
        self._lost: dict[int, float] = {}       # departed device -> share of the ATTN shards (KV) it held
        self._floor = 0.0                       # pruned fraction forced by departed devices (disconnect_kv=prune)
        self._cache: dict = {}
        self._last_m: int | None = None          # previous search result: warm start of the next search
        self._last_prune: float | None = None    # and its pruned fraction
        self.fb = QosFeedback(ctx.cfg.feedback, ctx.cluster.n, ctx.cfg.qos_margin)   # closed loop (feedback.py)
        self._ran: PhasePlan | None = None       # the plan the cluster ran last (from `observe`)
        self._bridged: PhasePlan | None = None   # a bridge plan running while a re-planned placement loads
        self._bridge_of: PhasePlan | None = None # the plan the bridge was made from
        self.kv_holds = 0                        # restores of pruned ATTN shards deferred (their KV rebuild too long)

    def lost_kv(self) -> str:
        """Context KV of a departed device: pruned with its shards (`disconnect_kv=prune`, paper §4.3, see
        `_update_lost`) or re-prefilled (`recompute`)."""
        return self.ctx.cfg.disconnect_kv

    # ---- communication scaling ---------------------------------------------------------------------------------------
    def act_at(self, k: int) -> np.ndarray:
        N = self.ctx.table.n
        act = np.zeros(N, dtype=np.int64)
        act[self.order[:min(k, N)]] = 1
        if k > N:
            act[self.order[:k - N]] = 2
        return act

    def scaled_search(self, envs: list[tuple[PhaseEnv, float]]):
        """Communication scaling, then computation scaling (paper §4.3, footnote 5: communication scaling runs first so
        that communication does not eat the QoS margin computation scaling protects accuracy with): the precision /
        pruning search (`precision.py`) with the transferred activations at FP16, and — when the plan communicates —
        with the activations of every sublayer at INT8 and at INT4; the result kept is the most accurate one that
        meets the targets (if none does, the fastest). Activation precision is cheap in accuracy next to weight
        precision or pruning, so on a weak link this keeps weights and shards that the search alone would give up."""
        N = self.ctx.table.n
        best = self.search.search(envs, hint=self._last_m, min_prune=self._floor, prune_hint=self._last_prune)
        if self.ctx.cfg.comm_scaling and best.fits and best.plans[-1].est_comm_s > 0:
            acc = self.accuracy(best.plans[-1])
            for k in (N, 2 * N):
                r = self.search.search(envs, act=self.act_at(k), hint=best.m, min_prune=self._floor,
                                       prune_hint=best.prune_frac)
                if not r.fits:
                    continue
                a = self.accuracy(r.plans[-1])
                if (r.qos_ok and not best.qos_ok) or (r.qos_ok and a > acc + 1e-9) or \
                        (not r.qos_ok and not best.qos_ok and r.plans[-1].est_time_s < best.plans[-1].est_time_s):
                    best, acc = r, a
        self._last_m, self._last_prune = best.m, best.prune_frac
        return best

    def comm_scale(self, env: PhaseEnv, plan: PhasePlan, prune: float) -> PhasePlan:
        qos = self.fb.target(1, self.ctx.cfg.qos_tpot_s)
        if not self.ctx.cfg.comm_scaling or not plan.fits or plan.est_time_s <= qos or plan.est_comm_s <= 0:
            return plan
        if plan.est_time_s - plan.est_comm_s > qos:
            return plan                       # computation, not communication, breaks QoS: nothing to gain here
        hp, N = self.hp, self.ctx.table.n
        opt = hp.options(env, prune)
        prec = plan.precision
        ok_max = hp.quick(opt, env, prec, self.act_at(2 * N))
        if ok_max[0] and ok_max[1] <= qos:
            lo, hi = 1, 2 * N
            while lo < hi:
                mid = (lo + hi) // 2
                f, est = hp.quick(opt, env, prec, self.act_at(mid))
                if f and est <= qos:
                    hi = mid
                else:
                    lo = mid + 1
            return hp.assign(opt, env, prec, self.act_at(lo))
        plan = hp.assign(opt, env, prec, self.act_at(2 * N))
        if not plan.fits:
            return plan
        return self.prune_activations(plan, env, qos)

    def prune_activations(self, plan: PhasePlan, env: PhaseEnv, qos: float) -> PhasePlan:
        """Communication scaling's last step (§4.3.2): prune the remote shards of TP layers and the activations they
        exchange, least important layers first, until the estimate meets `qos` (or every TP layer is local)."""
        hp = self.hp
        opt = hp.options(env, 0.0)
        prec = plan.precision
        tp_layers = np.flatnonzero((plan.strategy == TP) & (plan.shards[:, 1:].sum(axis=1) > 0))
        if tp_layers.size == 0:
            return plan
        rank = np.argsort(self.ctx.importance.per_sublayer[tp_layers], kind="stable")
        cand = tp_layers[rank]
        tpos = hp.tpos[self.ctx.table.type_of[cand]]
        k0 = plan.shards[cand, 0]
        main_part = np.where(k0 > 0, opt.b[0, prec[cand], tpos] + k0 * opt.u[0, prec[cand], tpos], 0.0)
        saving = plan.layer_comp_s[cand] + plan.layer_comm_s[cand] - main_part
        need = plan.est_time_s - qos
        n = min(int(np.searchsorted(np.cumsum(saving), need)) + 1, cand.size)
        sel = cand[:n]
        shards = plan.shards.copy()
        pruned = plan.pruned.copy()
        pruned[sel] += shards[sel, 1:].sum(axis=1)
        shards[sel, 1:] = 0
        act_pruned = plan.act_pruned.copy()
        act_pruned[sel] = True
        return hp.fixed(opt, env, prec, plan.act_precision, shards, pruned, act_pruned)

    def tpot_target(self) -> float:
        """Decode time the search plans to: QoS over the closed loop's margin (`feedback.py`); in energy mode also
        minus the margin that computation scaling creates for DVFS (paper §4.4)."""
        cfg = self.ctx.cfg
        t = self.fb.target(1, cfg.qos_tpot_s)
        return t * (1 - cfg.energy_scaling) if cfg.energy_mode else t

    # ---- closed loop (feedback.py) -----------------------------------------------------------------------------------
    def _sync(self) -> None:
        """Plan with the latest corrections of the latency and communication models."""
        fb = self.fb
        self.hp.set_correction(np.stack([fb.comp_scale(0), fb.comp_scale(1)]),
                               np.stack([fb.comm_scale(0), fb.comm_scale(1)]))

    def observe(self, plan: PhasePlan, n_tokens: int, kv_len: int, links: LinkState, step_s: float,
                busy_s: np.ndarray, link_s: np.ndarray) -> None:
        """Compare a measured step with the uncorrected models' view of it (per device and per link) and with the
        corrected estimate; a decode step above the TPOT QoS forces a re-plan at the next token."""
        phase = 0 if plan.phase == "prefill" else 1
        t_dev, head, _, est_link = self.hp.raw_parts(plan, n_tokens, kv_len, links)
        comm = self.hp.raw_parts(plan, n_tokens, kv_len, links.scaled(self.fb.comm_scale(phase)))[2]
        busy_s = np.asarray(busy_s, dtype=float)
        if plan.freq.size == t_dev.shape[1]:
            # energy mode: the estimate takes the planner's DVFS assumption (all time ∝ 1/f); a device below its top
            # level says nothing about its model at the top level, so it does not update its correction
            t_dev, head = t_dev / plan.freq[None, :], head / plan.freq[0]
            busy_s = np.where(plan.freq < 1.0, 0.0, busy_s)
        self._ran = plan
        if plan is not self._bridged:
            self._bridged = None                  # the re-planned placement has taken over
        est_busy = t_dev.sum(axis=0)
        est_busy[0] += head
        k = self.fb.comp_scale(phase)
        est_corr = float((t_dev * k[None, :]).max(axis=1).sum() + k[0] * head + comm)
        self.fb.observe(Observation(phase, step_s, busy_s, np.asarray(link_s, dtype=float),
                                    est_busy, est_link, est_corr))
        if phase == 1 and step_s > self.ctx.cfg.qos_tpot_s:
            self.fb.violations += 1
            self._key = None

    # ---- energy mode (§4.4) ------------------------------------------------------------------------------------------
    def dvfs(self, plan: PhasePlan) -> PhasePlan:
        """Lowest DVFS level per device whose (conservatively scaled) TPOT estimate keeps the energy margin: the
        planner assumes all of a device's time scales with 1/f (its regression does not split compute from memory
        time); memory-bound decode actually slows less, which the simulator's roofline shows."""
        cfg = self.ctx.cfg
        if not cfg.energy_mode or not plan.fits:
            return plan
        budget = self.fb.target(1, cfg.qos_tpot_s) * (1 - cfg.energy_margin) - plan.est_comm_s
        comp = plan.est_time_s - plan.est_comm_s
        f_min = comp / budget if budget > 0 else 1.0
        freq = np.ones(self.hp.D)
        for d, dev in enumerate(self.ctx.cluster.devices):
            ok = [f for f in dev.dvfs_levels if f >= f_min]
            freq[d] = min(ok) if ok else 1.0
        if (freq == 1.0).all():
            return plan
        return dataclasses.replace(plan, freq=freq, est_time_s=comp / freq.min() + plan.est_comm_s)

    # ---- disconnects (§4.3: "the loss of connectivity prunes the weight tensors assigned to the disconnected device")
    def _update_lost(self, links: LinkState) -> None:
        """disconnect_kv=prune: a device that leaves while holding ATTN shards of the running plan takes their KV
        cache with it; that share of the ATTN shards is pruned (as the same fraction of every layer's shards, the
        paper's uniform pruning, so the accuracy proxy charges it through the importance-weighted pruned share) until
        the device is reachable again (its shards are then reloaded in the background and the search restores them)."""
        if self.ctx.cfg.disconnect_kv != "prune":
            return
        conn = links.connected
        for d in range(1, conn.size):
            if conn[d]:
                self._lost.pop(d, None)
            elif d not in self._lost and self.current is not None:
                tb = self.ctx.table
                held = self.current.shards[self._attn, d].sum()
                if held > 0:
                    total = (tb.shards[tb.type_of[self._attn]] - self.current.pruned[self._attn]).sum()
                    self._lost[d] = float(held / max(total, 1))
        self._floor = min(sum(self._lost.values()), 1.0)

    # ---- the contract ---------------------------------------------------------------------------------------------
    def _plan_turn(self, links, budgets, n_in, kv_len):
        cfg = self.ctx.cfg
        self._sync()
        pre = self.env(0, n_in, kv_len, links, budgets)
        dec = self.env(1, 1, kv_len + n_in, links, budgets)
        res = self.scaled_search([(pre, self.fb.target(0, cfg.qos_ttft_s)), (dec, self.tpot_target())])
        decode = self.dvfs(self.comm_scale(dec, res.plans[1], res.prune_frac))
        return res, res.plans[0], decode

    def _reload_s(self, frm: np.ndarray, to: PhasePlan, same_prec: np.ndarray) -> float:
        """Seconds to load what `to` needs beyond the resident bytes `frm` (N, D), slowest device's flash."""
        need = np.where(same_prec[:, None], np.maximum(self.weight_bytes(to) - frm, 0.0), self.weight_bytes(to))
        bw = np.array([d.storage_gbps * 1e9 for d in self.ctx.cluster.devices])
        return float((need.sum(axis=0) / bw).max())

    def _reload_aware_prefill(self, prefill: PhasePlan, decode: PhasePlan, links, budgets, n_in, kv_len) -> PhasePlan:
        """Per-phase plans cost reloads at every turn (decode placement → prefill placement → decode placement). Keep
        the resident decode placement for the prefill when that is faster once the exposed reloads are counted
        (reloads overlap with the prefill's compute, paper §4.3 "Overhead Mitigation")."""
        cur = self.current
        if cur is None or self.resident is None:
            return prefill
        pre = self.env(0, n_in, kv_len, links, budgets)
        keep = self.hp.fixed(self.hp.options(pre, 0.0), pre, cur.precision, cur.act_precision, cur.shards, cur.pruned,
                             cur.act_pruned)
        if not keep.fits:
            return prefill
        res_a = self.weight_bytes(prefill)
        r_a = self._reload_s(self.resident, prefill, cur.precision == prefill.precision)
        r_a2 = self._reload_s(res_a, decode, prefill.precision == decode.precision)
        cost_a = prefill.est_time_s + max(0.0, r_a - prefill.est_time_s) + max(0.0, r_a2 - prefill.est_time_s)
        r_b2 = self._reload_s(self.resident, decode, cur.precision == decode.precision)
        cost_b = keep.est_time_s + max(0.0, r_b2 - keep.est_time_s)
        return keep if cost_b < cost_a else prefill

    def start_turn(self, links: LinkState, budgets: np.ndarray, n_in: int, kv_len: int) -> Decision:
        self._update_lost(links)
        (res, prefill, decode), ms = timed(self._plan_turn, links, budgets, n_in, kv_len)
        if not res.fits:
            return Decision(plan=prefill, next_plan=decode, plan_ms=ms, oom=True, searched=True)
        prefill = self._reload_aware_prefill(prefill, decode, links, budgets, n_in, kv_len)
        cfg = self.ctx.cfg
        prefill, cost, held = self._hold_kv(prefill, self._ran, self.env(0, n_in, kv_len, links, budgets),
                                            self.fb.target(0, cfg.qos_ttft_s), kv_len, links)
        decode, cost_dec, held_dec = self._hold_kv(decode, prefill, self.env(1, 1, kv_len + n_in, links, budgets),
                                                   self.tpot_target(), kv_len + n_in, links)
        changed = self.changed(self.current, prefill)
        reload = self.adopt(prefill)
        self._key = None
        self._first_decode = (decode, kv_len + n_in, tuple(links.connected.tolist()), cost_dec, held_dec)
        return Decision(plan=prefill, next_plan=decode, reload_bytes=reload, replanned=changed, plan_ms=ms,
                        searched=True, switch_est_s=cost, kv_held=held)

    def end_turn(self, links: LinkState, budgets: np.ndarray, kv_len: int, idle_s: float) -> Decision | None:
        """While the user reads and types (`idle_s`), the cluster is idle: ATTN shards the running plan pruned (a
        bridge, a departed device, a restore deferred by `_hold_kv`) come back if the decode search for this context
        wants them and their reload and KV rebuild (estimated) end within the wait (paper §4.3.2: pruned activations
        are restored when the links allow). None when nothing needs restoring or the wait is too short."""
        ran = self._ran
        if ran is None or ran.phase != "decode" or self.resident is None:
            return None
        self._update_lost(links)
        self._key = None
        (plan, fits), ms = timed(self.replan_decode, links, budgets, kv_len)
        if not fits or not restores_kv(self.ctx.table, ran, plan):
            return None
        cost = self.kv_rebuild_s(ran, plan, kv_len, links)
        if cost + self._reload_s(self.resident, plan, self.current.precision == plan.precision) > idle_s:
            return None
        reload = self.adopt(plan)
        self._ran, self._bridged = plan, None          # the runtime runs the rebuild on it before the next step
        return Decision(plan=plan, reload_bytes=reload, replanned=True, plan_ms=ms, searched=self._searched,
                        switch_est_s=cost)

    def replan_decode(self, links: LinkState, budgets: np.ndarray, kv_len: int) -> tuple[PhasePlan, bool]:
        """Decode-phase re-plan (precision search + comm scaling) for the current observation; (plan, fits). The KV
        cache is reserved one bucket ahead (`_ahead`), so the switch the next bucket forces is found while the
        running plan still fits and loads in the background."""
        self._sync()
        dec = self._ahead(kv_len, links, budgets)
        key = (dec.kv_plan, links.mcs_key, tuple(dec.budgets.tolist()), self._floor, self.fb.key())
        hit = self._cache.get(key)
        self._searched = hit is None
        if hit is not None:
            return hit
        res = self.scaled_search([(dec, self.tpot_target())])
        plan = self.dvfs(self.comm_scale(dec, res.plans[0], res.prune_frac))
        out = (plan, res.fits)
        if len(self._cache) > 2048:
            self._cache.clear()
        self._cache[key] = out
        return out

    def _ahead(self, kv_len: int, links: LinkState, budgets: np.ndarray) -> PhaseEnv:
        """Decode environment with the KV reservation one `kv_bucket` ahead of the current one."""
        return self.env(1, 1, kv_len + self.ctx.cfg.kv_bucket, links, budgets)

    # ---- switch cost: the KV of restored ATTN shards ----------------------------------------------------------------
    def kv_rebuild_s(self, frm: PhasePlan | None, to: PhasePlan, kv_len: int, links: LinkState) -> float:
        """Modelled seconds of the one-time KV rebuild a switch from the plan that ran (`frm`) to `to` costs: 0 unless
        `to` restores ATTN shards `frm` had pruned (`restores_kv`); then a re-prefill of the `kv_len` cached tokens
        on `to` (the prefill regression with its closed-loop corrections; memory was checked for `to` itself)."""
        if frm is None or kv_len <= 0 or not restores_kv(self.ctx.table, frm, to):
            return 0.0
        env = PhaseEnv(0, int(kv_len), 0, int(kv_len), links, np.where(links.connected, UNBOUNDED_B, 0.0))
        return float(self._recost(to, env).est_time_s)

    def _hold_kv(self, plan: PhasePlan, frm: PhasePlan | None, env: PhaseEnv, target: float, kv_len: int,
                 links: LinkState, keep_frm: bool = True) -> tuple[PhasePlan, float, bool]:
        """(plan to adopt, its switch cost, deferred?): `plan` if restoring the ATTN shards `frm` pruned costs
        nothing or the step that pays the rebuild still meets `target`; else the most accurate plan that keeps
        `frm`'s pruning of every ATTN sublayer and meets `target` (`env` is the plan's), so the restore waits for a
        step that can pay for it: `plan` thinned to that pruning (a subset of its shards: its FFN shards come back),
        or — `keep_frm`, `frm` being the plan that runs — `frm` itself (resident, its KV all there). The thinned plan
        keeps the precision the search chose for all of `plan`'s shards, so it can be the less accurate of the two."""
        if frm is None or not plan.fits:
            return plan, 0.0, False
        cost = self.kv_rebuild_s(frm, plan, kv_len, links)
        if cost <= 0 or plan.est_time_s + cost <= target:
            return plan, cost, False
        cands = [self._thin_to(plan, env, np.where(self._attn, frm.pruned, 0))]
        if keep_frm:
            cands.append(self._recost(frm, env))
        ok = [c for c in cands if c.fits and c.est_time_s <= target] or [c for c in cands[:1] if c.fits]
        if not ok:
            return plan, cost, False
        self.kv_holds += 1
        return max(ok, key=self.accuracy), 0.0, True

    def _recost(self, plan: PhasePlan, env: PhaseEnv) -> PhasePlan:
        return self.hp.fixed(self.hp.options(env, 0.0), env, plan.precision, plan.act_precision, plan.shards,
                             plan.pruned, plan.act_pruned)

    # ---- run-time levers on the running plan (no weight reload) ------------------------------------------------------
    def _thin(self, plan: PhasePlan, env: PhaseEnv, frac: float) -> PhasePlan:
        """`plan` with at least `frac` of every sublayer's shards pruned (least important first, paper §4.3.1)."""
        tb = self.ctx.table
        S = tb.shards[tb.type_of]
        return self._thin_to(plan, env, np.minimum(np.rint(frac * S).astype(np.int64), S - 1))

    def _thin_to(self, plan: PhasePlan, env: PhaseEnv, floor: np.ndarray) -> PhasePlan:
        """`plan` with at least `floor` (N,) shards pruned per sublayer, taken from the devices that hold them in
        proportion to what each holds: a subset of the plan's shards, so it needs no reload beyond the plan's."""
        tb = self.ctx.table
        S = tb.shards[tb.type_of]                                            # (N,)
        pruned = np.maximum(plan.pruned, np.minimum(floor, S))
        held = plan.shards.sum(axis=1)                                       # (N,)
        keep = np.minimum(S - pruned, held)
        share = plan.shards * (keep / np.maximum(held, 1))[:, None]
        shards = np.floor(share).astype(np.int64)
        for _ in range(plan.shards.shape[1]):                                # largest remainder, ≤ D rounds
            short = keep - shards.sum(axis=1)
            if not short.any():
                break
            d = np.argmax(np.where(plan.shards > shards, share - shards, -1.0), axis=1)
            shards[np.arange(tb.n), d] += short > 0
        pruned = S - shards.sum(axis=1)
        return self.hp.fixed(self.hp.options(env, 0.0), env, plan.precision, plan.act_precision, shards, pruned,
                             plan.act_pruned)

    def bridge(self, ran: PhasePlan, env: PhaseEnv, target: float) -> PhasePlan | None:
        """The running plan breaks the decode target and the re-planned placement is still loading: the run-time
        levers that need no weight reload act at once, in the paper's order — communication scaling (activations of
        the least important sublayers to INT8, then INT4; footnote 5: before computation scaling), then pruning the
        same fraction of shards from every layer (§4.3.1). Precision scaling, which reloads weights, is the re-planned
        placement itself (loading in the background). None when the running plan meets the target (or no lever
        changes it); otherwise the smallest step of the levers that meets it, or all of them (best effort)."""
        cfg, N = self.ctx.cfg, self.ctx.table.n
        cur = self._recost(ran, env)
        if not cur.fits or cur.est_time_s <= target:
            return None
        out = cur
        if cfg.comm_scaling and cur.est_comm_s > 0:
            def act(k):
                return self.hp.fixed(self.hp.options(env, 0.0), env, ran.precision,
                                     np.maximum(ran.act_precision, self.act_at(k)), ran.shards, ran.pruned,
                                     ran.act_pruned)
            top = act(2 * N)
            if top.est_time_s > target:                          # then the activations of TP layers (and shards)
                top = self.prune_activations(top, env, target)
                if top.est_time_s <= target or not cfg.compute_pruning:
                    return top
            elif top.est_time_s <= target:
                lo, hi = 1, 2 * N
                while lo < hi:
                    mid = (lo + hi) // 2
                    if act(mid).est_time_s <= target:
                        hi = mid
                    else:
                        lo = mid + 1
                return act(lo)
            out = top
        if cfg.compute_pruning:
            steps = cfg.prune_steps
            best = self._thin(out, env, (steps - 1) / steps)
            if best.est_time_s > target:
                return best
            lo, hi = 1, steps - 1
            while lo < hi:
                mid = (lo + hi) // 2
                if self._thin(out, env, mid / steps).est_time_s <= target:
                    hi = mid
                else:
                    lo = mid + 1
            out = self._thin(out, env, lo / steps)
        return out if self.changed(ran, out) else None

    def step(self, links: LinkState, budgets: np.ndarray, kv_len: int) -> Decision:
        d = self._step(links, budgets, kv_len)
        if d.oom or (d.replanned and d.urgent):
            self._bridged = None
            return d
        # the plan that will run this token: the one that ran last (a new plan loads in the background, or nothing
        # changed); if it breaks the target, bridge it with the levers that need no reload
        ran = self._ran
        if ran is None or ran.phase != "decode" or ran is d.plan:
            return d
        now = self.env(1, 1, kv_len, links, budgets)
        target = self.fb.target(1, self.ctx.cfg.qos_tpot_s)
        if self._bridged is not None and ran is self._bridged and self._bridge_of is self.current \
                and not d.replanned:
            base = self._recost(self.current, now)
            if base.fits and base.est_time_s <= target:      # the bridged plan meets the target again: restore it
                cost = self.kv_rebuild_s(ran, self.current, kv_len, links)   # (its pruned shards never left
                if base.est_time_s + cost <= target:                         # memory: no reload; their KV did)
                    self._bridged = None
                    return dataclasses.replace(d, plan=self.current, replanned=True, urgent=True, switch_est_s=cost)
                # the rebuild does not fit in this step: restore all but the bridge's ATTN pruning (resident shards)
                self.kv_holds += 1
                d = dataclasses.replace(d, kv_held=True)
                held = self._thin_to(self.current, now, np.where(self._attn, ran.pruned, 0))
                if held.fits and held.est_time_s <= target and self.changed(ran, held):
                    self._bridged = held
                    return dataclasses.replace(d, bridge=held, bridge_of=self._bridge_of)
        b = self.bridge(ran, now, target)
        if b is None and ran is self._bridged and not d.replanned:
            b = ran                   # the bridge keeps running (a restore is the policy's decision, made above)
        if b is not None:
            self._bridged, self._bridge_of = b, (self._bridge_of if ran is self._bridged else ran)
            d = self._hold_for_bridge(dataclasses.replace(d, bridge=b, bridge_of=self._bridge_of), b, kv_len, links,
                                      budgets, target)
        return d

    def _hold_for_bridge(self, d: Decision, b: PhasePlan, kv_len: int, links: LinkState, budgets: np.ndarray,
                         target: float) -> Decision:
        """A bridge runs while a re-planned placement (`self.current`) loads; once loaded, that placement replaces
        the bridge, so it must not restore ATTN shards the bridge pruned unless the step that pays their KV rebuild
        meets the target (`_hold_kv`): otherwise the loading placement keeps the bridge's ATTN pruning (a subset of
        its shards: nothing more to load) and the shards come back at a step that can pay for them."""
        cur = self.current
        if cur is None or cur is self._bridge_of or cur.phase != "decode":
            return d
        plan, _, held = self._hold_kv(cur, b, self._ahead(kv_len, links, budgets), target, kv_len, links,
                                      keep_frm=False)
        if not held:
            return d
        reload = self.adopt(plan)
        if d.replanned:
            reload = d.reload_bytes           # (adopted at this step: `cur`'s load covers its subset)
        return dataclasses.replace(d, plan=plan, replanned=True, urgent=False, reload_bytes=reload, kv_held=True)

    def _step(self, links: LinkState, budgets: np.ndarray, kv_len: int) -> Decision:
        self._update_lost(links)
        b = self.ctx.cfg.kv_bucket
        key = (int(np.ceil((kv_len + 2) / b)), links.mcs_key, tuple(np.where(links.connected, budgets, 0).tolist()),
               self._floor, self.fb.key())
        first = self.__dict__.pop("_first_decode", None)
        if first is not None and first[1] == kv_len and first[2] == tuple(links.connected.tolist()):
            # first token of a turn: the decode plan searched with the prefill (same precisions); its shards were
            # loading in the background during the prefill (not if a device left or came back meanwhile: re-plan)
            self._key = key
            reload = self.adopt(first[0])
            return Decision(plan=first[0], reload_bytes=reload, replanned=True, urgent=False, switch_est_s=first[3],
                            kv_held=first[4])
        if key == self._key and self.current is not None:
            return Decision(plan=self.current)
        self._key = key
        (plan, fits), ms = timed(self.replan_decode, links, budgets, kv_len)
        searched = self._searched
        if not fits:
            return Decision(plan=plan, plan_ms=ms, oom=True, searched=searched)
        plan, cost, held = self._hold_kv(plan, self._ran, self._ahead(kv_len, links, budgets),
                                         self.fb.target(1, self.ctx.cfg.qos_tpot_s), kv_len, links)
        if not self.changed(self.current, plan):
            return Decision(plan=self.current, plan_ms=ms, searched=searched)
        # hysteresis: keep the current plan (no reload) while it fits this bucket and the next, meets QoS and the new
        # plan is not clearly more accurate; otherwise switch — urgently (reload in the foreground) only when the
        # current plan no longer fits this bucket, else in the background
        cur, urgent = self.current, True
        if cur is not None and cur.phase == "decode":
            urgent = not self._recost(cur, self.env(1, 1, kv_len, links, budgets)).fits
            again = self._recost(cur, self._ahead(kv_len, links, budgets))
            qos = self.fb.target(1, self.ctx.cfg.qos_tpot_s)
            meets = again.fits and (again.est_time_s <= qos or again.est_time_s <= plan.est_time_s)
            if meets and self.accuracy(plan) < self.accuracy(cur) + self.ctx.cfg.restore_gain:
                return Decision(plan=cur, plan_ms=ms, searched=searched)
        reload = self.adopt(plan)
        return Decision(plan=plan, reload_bytes=reload, replanned=True, plan_ms=ms, urgent=urgent, searched=searched,
                        switch_est_s=cost, kv_held=held)
