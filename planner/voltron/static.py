"""Shared machinery of the baselines (paper §5.1.3): a fixed layout rule, uniform precision, no elasticity.

A baseline plans at the start of every turn (and again only when it must: its memory reservation for the KV cache is
exhausted or a device it uses left), with the same layout for prefill and decode (no per-phase or per-layer strategy,
no mixed precision, no pruning, no activation quantization, reloads not overlapped). Subclasses implement
`layout(env, opt, precision) -> shards (N, D)`.

Precision choice (fair baselines): the baseline picks the *best
uniform precision that meets QoS*, with the same objective, information and search budget as Voltron's search
(`precision.py`):
- objective: the highest uniform precision (FP16 > INT8 > INT4: the most accurate) whose plans fit every device and
  whose estimated prefill / decode times meet (1 − `qos_margin`) × the TTFT / TPOT QoS — Voltron's targets;
- best effort exactly as Voltron's search: a TPOT target no uniform precision meets → the fastest fitting one; a TTFT
  target none meets is dropped (accuracy is not sacrificed for a one-off target); nothing fits → OOM;
- information: the same fitted `LatencyModel` estimates (`HybridPlanner.fixed`) and memory budgets;
- search budget = plan evaluations per (re-)plan, at the same events. A baseline's space is the 3 uniform
  precisions, so it evaluates all of them (`SEARCH_EVALS` = 3 layouts, each costed for prefill and decode), which
  is within Voltron's binary search budget of ⌈log2(2N + 1)⌉ + 3 evaluations (≈ 11 for N = 96 sublayers). The
  *model* choice (which model of a family) is made, for every planner alike, by the report
  (`sim/multidevice/report.py`).
"""
from __future__ import annotations

import numpy as np

from planner.voltron.comm import LinkState
from planner.voltron.devices import PRECISIONS
from planner.voltron.options import OptionTable, PhaseEnv
from planner.voltron.plan import PhasePlan
from planner.voltron.policy import Decision, Policy, timed

SEARCH_EVALS = len(PRECISIONS)       # plan evaluations per baseline (re-)plan: every uniform precision


class StaticPolicy(Policy):
    overlap_reload = False

    def layout(self, env: PhaseEnv, opt: OptionTable, precision: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def speeds(self, opt: OptionTable, precision: int, alive: np.ndarray) -> np.ndarray:
        """(D,) relative device speed: 1 / predicted time of one block at `precision` (0 for dead devices)."""
        t = (opt.b[:, precision, :].sum(axis=1)
             + (opt.u[:, precision, :] * self.hp.table.shards[self.hp.types]).sum(axis=1))
        return np.where(alive, 1.0 / t, 0.0)

    def _candidates(self, dec: PhaseEnv, pre: PhaseEnv | None) -> list[tuple[PhasePlan, PhasePlan | None]]:
        """(decode plan, prefill plan or None) of every uniform precision, highest first; the layout is chosen on the
        decode env (its KV reservation is the larger one) and shared by both phases."""
        N = self.ctx.table.n
        opt = self.hp.options(dec, 0.0)
        out = []
        for p in range(SEARCH_EVALS):
            prec = np.full(N, p, dtype=np.int64)
            shards = self.layout(dec, opt, prec)
            zeros = np.zeros(N, dtype=np.int64)
            d_plan = self.hp.fixed(opt, dec, prec, zeros, shards, zeros)
            p_plan = None
            if pre is not None:
                p_plan = self.hp.fixed(self.hp.options(pre, 0.0), pre, prec, zeros, shards, zeros)
            out.append((d_plan, p_plan))
        return out

    def _choose(self, cands: list[tuple[PhasePlan, PhasePlan | None]]) -> tuple[PhasePlan, PhasePlan | None]:
        """The best uniform precision that meets QoS (module docstring); the lowest precision's plans if none fits."""
        cfg = self.ctx.cfg
        keep = 1 - cfg.qos_margin
        fit = [(d, p) for d, p in cands if d.fits and (p is None or p.fits)]
        if not fit:
            return cands[-1]
        tpot_ok = [d.est_time_s <= cfg.qos_tpot_s * keep for d, _ in fit]
        ttft_ok = [p is None or p.est_time_s <= cfg.qos_ttft_s * keep for _, p in fit]
        if not any(tpot_ok):                                  # unreachable TPOT: the fastest configuration
            return min(fit, key=lambda c: c[0].est_time_s)
        use_ttft = any(t and q for t, q in zip(tpot_ok, ttft_ok))   # else the TTFT target is dropped
        for c, t, q in zip(fit, tpot_ok, ttft_ok):
            if t and (q or not use_ttft):
                return c
        return fit[-1]                                        # not reached (some candidate meets TPOT)

    def _plan_turn(self, links, budgets, n_in, kv_len):
        pre = self.env(0, n_in, kv_len, links, budgets)
        dec = self.env(1, 1, kv_len + n_in, links, budgets)
        d_plan, p_plan = self._choose(self._candidates(dec, pre))
        return p_plan, d_plan

    def _replan_decode(self, dec: PhaseEnv) -> PhasePlan:
        return self._choose(self._candidates(dec, None))[0]

    def start_turn(self, links: LinkState, budgets: np.ndarray, n_in: int, kv_len: int) -> Decision:
        (prefill, decode), ms = timed(self._plan_turn, links, budgets, n_in, kv_len)
        if not (prefill.fits and decode.fits):
            return Decision(plan=prefill, next_plan=decode, plan_ms=ms, oom=True, searched=True)
        changed = self.changed(self.current, decode)
        reload = self.adopt(decode)
        self._key = None
        return Decision(plan=prefill, next_plan=decode, reload_bytes=reload, replanned=changed, plan_ms=ms,
                        searched=True)

    def step(self, links: LinkState, budgets: np.ndarray, kv_len: int) -> Decision:
        cur = self.current
        alive = links.connected & (budgets > 0)
        lost = bool((cur.shards[:, ~alive] > 0).any())
        if not lost and kv_len + 1 <= cur.kv_plan:
            return Decision(plan=cur)
        # forced re-plan (KV reservation exhausted or a device left), same rule (decode QoS only), full reload
        dec = self.env(1, 1, kv_len, links, budgets)
        plan, ms = timed(self._replan_decode, dec)
        if not plan.fits:
            return Decision(plan=plan, plan_ms=ms, oom=True, searched=True)
        changed = self.changed(cur, plan)
        reload = self.adopt(plan)                  # zero bytes when only the KV reservation moved
        return Decision(plan=plan, reload_bytes=reload, replanned=changed, plan_ms=ms, searched=True)


def proportional(total: int, weights: np.ndarray, caps: np.ndarray | None = None) -> np.ndarray:
    """Integer split of `total` proportional to `weights` (largest remainder), each share ≤ its cap when possible."""
    w = np.asarray(weights, dtype=float)
    D = len(w)
    caps = np.full(D, total) if caps is None else np.minimum(np.maximum(caps, 0), total).astype(np.int64)
    out = np.zeros(D, dtype=np.int64)
    free = w > 0
    left = total
    for _ in range(D + 1):
        if left <= 0 or not free.any():
            break
        share = left * w * free / (w * free).sum()
        add = np.floor(share).astype(np.int64)
        rem = share - add
        k = left - add.sum()
        for i in np.argsort(-rem, kind="stable")[:k]:
            if free[i]:
                add[i] += 1
        room = caps - out
        add = np.minimum(add, room)
        out += add
        left = total - out.sum()
        free = free & (out < caps)
    return out
