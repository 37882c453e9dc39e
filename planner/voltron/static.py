"""Shared machinery of the baselines (paper §5.1.3): a fixed layout rule, uniform precision, no elasticity.

A baseline plans at the start of every turn (and again only when it must: its memory reservation for the KV cache is
exhausted or a device it uses left): it takes the highest *uniform* precision (FP16, else INT8, else INT4) whose
layout fits every device, with the same layout for prefill and decode (no per-phase or per-layer strategy, no
mixed precision, no pruning, no activation quantization, reloads not overlapped). If nothing fits: OOM.
Subclasses implement `layout(env, opt, precision) -> shards (N, D)`.
"""
from __future__ import annotations

import numpy as np

from planner.voltron.comm import LinkState
from planner.voltron.devices import PRECISIONS
from planner.voltron.hybrid import OptionTable, PhaseEnv
from planner.voltron.plan import PhasePlan
from planner.voltron.policy import Decision, Policy, timed


class StaticPolicy(Policy):
    overlap_reload = False

    def layout(self, env: PhaseEnv, opt: OptionTable, precision: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def speeds(self, opt: OptionTable, precision: int, alive: np.ndarray) -> np.ndarray:
        """(D,) relative device speed: 1 / predicted time of one block at `precision` (0 for dead devices)."""
        t = opt.b[:, precision] * len(opt.u[0, 0]) + (opt.u[:, precision, :] * self.hp.table.shards[self.hp.types]).sum(axis=1)
        return np.where(alive, 1.0 / t, 0.0)

    def _uniform(self, env: PhaseEnv) -> PhasePlan:
        opt = self.hp.options(env, 0.0)
        N = self.ctx.table.n
        plan = None
        for p in range(len(PRECISIONS)):
            prec = np.full(N, p, dtype=np.int64)
            shards = self.layout(env, opt, prec)
            plan = self.hp.fixed(opt, env, prec, np.zeros(N, dtype=np.int64), shards, np.zeros(N, dtype=np.int64))
            if plan.fits:
                return plan
        return plan

    def _plan_turn(self, links, budgets, n_in, kv_len):
        pre = self.env(0, n_in, kv_len, links, budgets)
        dec = self.env(1, 1, kv_len + n_in, links, budgets)
        # one layout for both phases: choose it on the decode env (its KV reservation is the larger one)
        d_plan = self._uniform(dec)
        opt = self.hp.options(pre, 0.0)
        p_plan = self.hp.fixed(opt, pre, d_plan.precision, d_plan.act_precision, d_plan.shards, d_plan.pruned)
        return p_plan, d_plan

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
        # forced re-plan (KV reservation exhausted or a device left), same rule, full reload
        dec = self.env(1, 1, kv_len, links, budgets)
        plan, ms = timed(self._uniform, dec)
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
