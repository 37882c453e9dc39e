"""Sequential memory-aware assignment of the hybrid planner (Voltron paper §4.2.1: "sequentially assigns a
parallelism strategy to each layer, while considering the memory budget"): layers are visited in order; each takes
its fastest option (from the option tables of `options.py`) that fits the remaining memory.

Done in runs rather than per layer: with every class at its current preferred option, a cumulative sum over the
remaining layers finds the first layer that overflows some device; the prefix is committed and only that class moves
to its next option. The loop runs at most (#classes × #options) times, not once per layer
(`tests/voltron/test_hybrid.py` checks it against a plain per-layer loop). Then a boundary-aware repair of alternating
remote MP placements (an addition beyond the paper, see `_repair`).
"""
from __future__ import annotations

import numpy as np

from planner.voltron.options import OptionTable, PhaseEnv


class SequentialAssign:
    """Mixin of `HybridPlanner`: the memory-aware pass over an option table (needs D and `_ranks`)."""

    def _run(self, opt: OptionTable, env: PhaseEnv, cls: np.ndarray) -> tuple[np.ndarray, bool]:
        """Sequential memory-aware pass in runs (see module docstring). Returns (chosen option per sublayer, fits)."""
        N = len(cls)
        rem = env.budgets - opt.reserve
        chosen = np.full(N, -1, dtype=np.int64)
        if (rem < 0).any():
            return chosen, False
        ranks = self._ranks if self._ranks.shape == opt.valid.shape else np.arange(opt.valid.shape[1])[None, :]
        pos = 0
        mem, order, n_opt = opt.mem, opt.order, opt.valid.shape[1]
        sm_d = opt.__dict__.get("_sm_d")                                     # sorted_mem split per device:
        if sm_d is None:                                                      # D compares beat one 3-D all()
            sm_d = opt.__dict__["_sm_d"] = [opt.sorted_mem[:, :, d].copy() for d in range(opt.sorted_mem.shape[2])]

        def fitting(cap):                                                     # (C, O): option fits on every device
            cap = cap.tolist()
            fit = sm_d[0] <= cap[0]
            for d in range(1, len(sm_d)):
                fit &= sm_d[d] <= cap[d]
            return fit

        # the first round depends only on the table and the budgets, not on the precisions: computed once per table
        # and reused by every step of the precision search
        key = rem.tobytes()
        first = opt.__dict__.get("_first")
        if first is None or first[0] != key:
            fit = fitting(rem * (1 + 1e-12)) & opt.valid
            has = fit.any(axis=1)
            first = opt.__dict__["_first"] = (key, has, np.where(has, fit.argmax(axis=1), n_opt))
        while True:
            cap = rem * (1 + 1e-12)                                          # same tolerance for both tests below
            c_rest = cls[pos:] if pos else cls
            if pos == 0 and first is not None:
                _, has, ptr = first
                ptr = ptr.copy()
                first = None
            else:
                # every class moves to its first option (from its current one on) that still fits the remaining
                # memory; memory only shrinks, so an option that does not fit now never will again
                fit = fitting(cap)
                fit &= opt.valid
                fit &= ranks >= ptr[:, None]
                has = fit.any(axis=1)
                ptr = np.where(has, fit.argmax(axis=1), n_opt)
            if not has[c_rest].all():
                return chosen, False
            cur = order[c_rest, ptr[c_rest]]                                 # (n_rem,)
            cum = mem[c_rest, cur].cumsum(axis=0)                            # (n_rem, D)
            over = (cum > cap).any(axis=1)
            i = int(over.argmax())
            if not over[i]:
                chosen[pos:] = cur
                return self._repair(opt, cls, chosen, rem - cum[-1]), True
            chosen[pos:pos + i] = cur[:i]
            if i:
                rem = rem - cum[i - 1]
            pos += i
            # layer `pos` overflows with its class's current option: that option is out for this class from now on
            ptr[cls[pos]] += 1

    def _repair(self, opt: OptionTable, cls: np.ndarray, chosen: np.ndarray, rem: np.ndarray) -> np.ndarray:
        """Boundary-aware repair of MP placements. The per-layer MP estimate charges one transfer per layer, so when
        ATTN and FFN prefer different remote devices the pass alternates between them and pays two hops per
        sublayer. Here an MP sublayer that starts a new device run is moved onto its predecessor's device when that
        fits the remaining memory and lowers compute + exact boundary cost. Skipped when there are ≤ 2 boundaries
        (the common case), so it costs nothing then."""
        D = self.D
        home = np.where(chosen < D, chosen, 0)
        if not home.any():                                                    # all on the main device: no boundary
            return chosen
        n_bound = np.count_nonzero(home[1:] != home[:-1]) + (home[0] != 0) + (home[-1] != 0)
        if n_bound <= 2:
            return chosen
        hop = opt.hop[0]                                                      # (D,) FP16 activations
        comp, mem = opt.comp, opt.mem
        N = len(cls)
        prev_home = np.concatenate([[0], home[:-1]])
        next_home = np.concatenate([home[1:], [0]])
        starts = np.flatnonzero((home != prev_home) & (chosen < D))
        if starts.size == 0:
            return chosen
        # vectorised screen: candidates whose move onto the predecessor's device would pay off in isolation
        c, h, pv, nx = cls[starts], home[starts], prev_home[starts], next_home[starts]
        old = comp[c, chosen[starts]] + hop[pv] + hop[h] + np.where(h != nx, hop[h] + hop[nx], 0.0)
        new = comp[c, pv] + np.where(pv != nx, hop[pv] + hop[nx], 0.0)
        cand = starts[np.isfinite(new) & (new < old)]
        rem = rem.tolist()                                                    # plain floats: same IEEE arithmetic
        for i in cand.tolist():                                               # few: apply in order, re-checking
            h = home[i]
            prev = home[i - 1] if i else 0
            if h == prev:
                continue
            nxt = home[i + 1] if i + 1 < N else 0
            c = cls[i]
            dmem = (mem[c, prev] - mem[c, chosen[i]]).tolist()
            if any(x > r for x, r in zip(dmem, rem)):
                continue
            old = comp[c, chosen[i]] + hop[prev] + hop[h] + (hop[h] + hop[nxt] if h != nxt else 0.0)
            new = comp[c, prev] + (hop[prev] + hop[nxt] if prev != nxt else 0.0)
            if new < old:
                chosen[i] = prev
                home[i] = prev
                rem = [r - x for r, x in zip(rem, dmem)]
        return chosen
