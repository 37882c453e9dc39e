"""Importance-aware mixed precision by binary search (Voltron §4.2.2) and shard pruning (§4.3.1 "Pruning").

Demotion index m ∈ [0, 2N] over the N sublayers sorted by ascending importance: the first min(m, N) go FP16 → INT8, and
then the first max(0, m − N) go on INT8 → INT4 (so m = 0 is all-FP16 and m = 2N all-INT4). Memory and latency fall
monotonically with m (paper §3.2.2), so the smallest m whose plan fits every device and meets the QoS targets is found
by binary search in ⌈log2(2N + 1)⌉ steps; every step re-runs the hybrid MP/TP planner on the candidate precisions
("re-search the parallel plan after precision changes"). A phase whose QoS target is missed even at m = 2N is left to
best effort: an unreachable TPOT target → the fastest configuration (m = 2N); an unreachable TTFT target is dropped from
the predicate (accuracy is not sacrificed for a one-off target that cannot be met). With `compute_pruning`, a TPOT
target missed at m = 2N because of computation is first tried with more pruned shards (the same fraction from every
layer, least important first, up to (prune_steps − 1)/prune_steps; accuracy traded for QoS as in the paper's
controller), and only if even that misses it is the target served best effort. If m = 2N does not fit, the same fraction
of shards is pruned from every layer (least important shards first; paper: "prunes the same number of shards from all
layers"), again by binary search over k/`prune_steps`, and m is searched once more under that pruning.

Each predicate evaluation reuses the cached per-class option tables of `HybridPlanner`, so a step costs one vectorised
sequential pass (~tens of µs).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.voltron.hybrid import HybridPlanner, PhaseEnv
from planner.voltron.plan import PhasePlan


@dataclass
class SearchResult:
    m: int                          # demotion index
    prune_frac: float               # fraction of shards pruned per layer
    precision: np.ndarray           # (N,) weight precision per sublayer
    plans: list[PhasePlan]          # one per phase env given (same order)
    fits: bool
    qos_ok: bool
    steps: int                      # predicate evaluations


class PrecisionSearch:
    def __init__(self, hp: HybridPlanner, importance: np.ndarray, prune_steps: int = 16, max_precision: int = 2,
                 compute_pruning: bool = False):
        self.hp = hp
        self.compute_pruning = compute_pruning                              # prune when compute breaks the TPOT QoS
        self.N = hp.table.n
        self.order = np.argsort(importance, kind="stable")                 # ascending importance
        self.prune_steps = prune_steps
        self.max_precision = max_precision                                  # 2 = INT4 allowed
        self.m_max = self.N * max_precision

    def precision_at(self, m: int) -> np.ndarray:
        prec = np.zeros(self.N, dtype=np.int64)
        prec[self.order[:min(m, self.N)]] = 1
        if self.max_precision >= 2 and m > self.N:
            prec[self.order[:m - self.N]] = 2
        return prec

    def _eval(self, envs: list[tuple[PhaseEnv, float]], m: int, prune: float, act) -> tuple[bool, bool]:
        # the stages of one search ask some configurations twice (e.g. all-lowest precision at the pruning the
        # compute stage found, then again with every target): answered from the first evaluation
        key = (m, prune, id(act), tuple((id(env), qos) for env, qos in envs))
        hit = self._seen.get(key)
        if hit is None:
            hit = self._seen[key] = self._evaluate(envs, m, prune, act)
        fits_all, qos_all, chosen = hit
        if fits_all:
            self._probe = (m, prune, act, chosen)
        return fits_all, qos_all

    def _evaluate(self, envs: list[tuple[PhaseEnv, float]], m: int, prune: float, act) -> tuple[bool, bool, list]:
        prec = self.precision_at(m)
        fits_all, qos_all = True, True
        opts = self._opts.get(prune)
        if opts is None:
            opts = self._opts[prune] = [self.hp.options(env, prune) for env, _ in envs]
        chosen = []
        for (env, qos), opt in zip(envs, opts):
            fits, est = self.hp.quick(opt, env, prec, act)
            chosen.append(self.hp.last_chosen)
            fits_all &= fits
            qos_all &= fits and (est <= qos or qos == np.inf)
            if not fits_all:
                break
        return fits_all, qos_all, chosen

    def _smallest(self, pred, lo: int, hi: int) -> int:
        """Smallest x in [lo, hi] with pred(x) true, assuming pred(hi) is true and pred is monotone."""
        while lo < hi:
            mid = (lo + hi) // 2
            if pred(mid):
                hi = mid
            else:
                lo = mid + 1
        return lo

    # ---- the search, in its stages ---------------------------------------------------------------------------------
    def search(self, envs: list[tuple[PhaseEnv, float]], act: np.ndarray | None = None,
               hint: int | None = None, min_prune: float = 0.0, prune_hint: float | None = None) -> SearchResult:
        """envs: (phase env, QoS time budget in s) pairs that must hold together (e.g. prefill + decode).

        `hint`: the previous solution; the search then gallops outward from it (1, 2, 4 … away) before bisecting,
        so a small change of conditions costs O(log |Δm|) plan evaluations instead of O(log N).

        `prune_hint`: the previous solution's pruned fraction; the pruning stages gallop from it the same way (a
        pruned fraction costs an option table of its own, so this saves table builds as well as evaluations).

        `min_prune`: a floor on the pruned fraction (shards lost with a departed device, see controller.py).

        Stages: (1) warm start from `hint` if it still works; (2) prune until all-lowest precision fits; (3) with
        `compute_pruning`, prune more when computation breaks the TPOT target; (4) drop / best-effort unreachable
        targets; (5) smallest demotion index m meeting the remaining targets."""
        self._steps = 0
        top = self.prune_steps - 1
        k0 = min(int(np.ceil(min_prune * self.prune_steps - 1e-9)), top) if min_prune > 0 else 0
        p0 = k0 / self.prune_steps
        self._opts: dict = {}
        self._seen: dict = {}
        self._probe = None
        self._envs, self._act = envs, act
        k_hint = None if prune_hint is None else int(round(prune_hint * self.prune_steps))

        # a previous solution that pruned more than the floor: all-lowest precision (the fastest, smallest plan) is
        # tried first, since if it fails unpruned the previous answer cannot work unpruned either
        pruned_before = k_hint is not None and k_hint > k0 and not all(self._ev(self.m_max, p0))
        if hint is not None and 0 <= hint <= self.m_max and not pruned_before and all(self._ev(hint, p0)):
            # fast path (token-level re-plans): the previous answer still works → gallop down from it
            hi, lo = self._gallop_down(hint, lambda m: all(self._ev(m, p0)))
            return self._finish(self._smallest(lambda m: all(self._ev(m, p0)), lo, hi), p0)

        fits_max, qos_max = self._ev(self.m_max, p0)
        prune = p0
        if not fits_max:
            prune = self._prune_to_fit(k0, top, k_hint)
            if prune is None:                                  # nothing fits even at the largest pruning
                return self._best_effort(top / self.prune_steps, fits=False)
            fits_max, qos_max = self._ev(self.m_max, prune)
        if not qos_max and self.compute_pruning and any(e.phase == 1 for e, _ in envs):
            prune, fits_max, qos_max = self._prune_for_compute(prune, top, fits_max, qos_max, k_hint)
        envs_q = envs
        if not qos_max:
            envs_q = self._reachable_targets(prune)
            if envs_q is None:                                 # unreachable TPOT: the fastest configuration
                return self._best_effort(prune, fits=True)

        def ok(m):
            self._steps += 1
            f, q = self._eval(envs_q, m, prune, act)
            return f and q

        lo, hi = self._bracket(ok, hint)
        return self._finish(self._smallest(ok, lo, hi), prune)

    def _ev(self, m: int, prune: float) -> tuple[bool, bool]:
        self._steps += 1
        return self._eval(self._envs, m, prune, self._act)

    @staticmethod
    def _gallop_down(hint: int, pred, lo: int = 0) -> tuple[int, int]:
        """pred(hint) holds: step down 1, 2, 4 … (not below `lo`) while pred holds; returns (hi, lo) bracketing the
        smallest x."""
        hi, step = hint, 1
        while hi - step >= lo and pred(hi - step):
            hi -= step
            step *= 2
        return hi, max(hi - step + 1, lo)

    @staticmethod
    def _gallop_up(hint: int, pred, hi: int) -> tuple[int, int]:
        """pred(hint) fails and pred(hi) holds: step up 1, 2, 4 … while pred fails; returns (lo, hi) bracketing the
        smallest x."""
        lo, step = hint + 1, 1
        while lo + step - 1 < hi and not pred(lo + step - 1):
            lo += step
            step *= 2
        return lo, min(lo + step - 1, hi)

    def _gallop(self, ok, hint: int, lo: int, hi: int) -> tuple[int, int]:
        """[lo, hi] holding the smallest x with ok(x), galloped from `hint` in [lo, hi] (either direction)."""
        if ok(hint):
            hi, lo = self._gallop_down(hint, ok, lo)
            return lo, hi
        return self._gallop_up(hint, ok, hi)

    def _bracket(self, ok, hint: int | None) -> tuple[int, int]:
        """[lo, hi] holding the smallest m with ok(m): the whole range, or galloped from `hint` (either direction)."""
        if hint is not None and 0 <= hint <= self.m_max:
            return self._gallop(ok, hint, 0, self.m_max)   # (with pruning or a dropped target the predicate differs)
        return 0, self.m_max

    def _smallest_k(self, pred, lo: int, top: int, k_hint: int | None) -> int | None:
        """Smallest pruning step k in [lo, top] with pred(k) (monotone), None if even pred(top) fails; galloped from
        `k_hint` when it lies in [lo, top), so that top is only evaluated (its option table built) when reached."""
        if k_hint is not None and lo <= k_hint < top:
            if pred(k_hint):
                hi, lo = self._gallop_down(k_hint, pred, lo)
                return self._smallest(pred, lo, hi)
            lo, step = k_hint + 1, 1                           # gallop up; top is built only if reached
            while True:
                x = min(lo + step - 1, top)
                if pred(x):
                    return self._smallest(pred, lo, x)
                if x == top:
                    return None
                lo, step = x + 1, 2 * step
        if not pred(top):
            return None
        return self._smallest(pred, lo, top)

    def _prune_to_fit(self, k0: int, top: int, k_hint: int | None = None) -> float | None:
        """Smallest pruned fraction k/prune_steps (> the floor k0) at which all-lowest precision fits; None if none."""
        if k0 >= top:
            return None
        k = self._smallest_k(lambda k: self._ev(self.m_max, k / self.prune_steps)[0], max(1, k0 + 1), top, k_hint)
        return None if k is None else k / self.prune_steps

    def _prune_for_compute(self, prune: float, top: int, fits_max: bool, qos_max: bool, k_hint: int | None = None):
        """Computation breaks the TPOT target even at all-INT4: prune more shards (the same fraction from every
        layer, least important shards first) up to (prune_steps - 1)/prune_steps, if that reaches the target
        (accuracy traded for QoS, paper §4.3.1); an unreachable target stays best effort. (prune, fits, qos)."""
        dec_only = [(e, q if e.phase == 1 else np.inf) for e, q in self._envs]

        def dec_ok(k):
            self._steps += 1
            f, q = self._eval(dec_only, self.m_max, k / self.prune_steps, self._act)
            return f and q

        k_cur = int(round(prune * self.prune_steps))
        if k_cur < top:
            k = self._smallest_k(dec_ok, k_cur + 1, top, k_hint)
            if k is not None:
                prune = k / self.prune_steps
                fits_max, qos_max = self._ev(self.m_max, prune)
        return prune, fits_max, qos_max

    def _reachable_targets(self, prune: float) -> list[tuple[PhaseEnv, float]] | None:
        """A QoS target unreachable even at the lowest precision: None when it is a decode (TPOT) target (served best
        effort by the fastest configuration, m = 2N); an unreachable prefill (TTFT) target is dropped (inf) so that
        the per-token accuracy is not sacrificed for a one-off target it cannot meet."""
        prec_max = self.precision_at(self.m_max)
        reach = [self.hp.quick(self.hp.options(e, prune), e, prec_max, self._act)[1] <= q for e, q in self._envs]
        self._steps += 1
        if any(e.phase == 1 and not r for (e, _), r in zip(self._envs, reach)):
            return None
        return [(e, q if r else np.inf) for (e, q), r in zip(self._envs, reach)]

    def _best_effort(self, prune: float, fits: bool) -> SearchResult:
        """All-lowest precision at `prune` (QoS not met; `fits` False when even that does not fit)."""
        prec = self.precision_at(self.m_max)
        plans = [self.hp.plan(e, prec, prune, self._act) for e, _ in self._envs]
        return SearchResult(self.m_max, prune, prec, plans, fits, False, self._steps)

    def _finish(self, m: int, prune: float) -> SearchResult:
        envs, act = self._envs, self._act
        prec = self.precision_at(m)
        pm, pp, pa, chosen = self._probe if self._probe is not None else (None, None, None, None)
        if pm == m and pp == prune and pa is act and all(e.phase == 1 for e, _ in envs):
            # the last successful probe was this very configuration: reuse its assignment (decode has a single
            # ranking, see HybridPlanner.assign)
            zero = np.zeros(self.N, dtype=np.int64) if act is None else act
            plans = [self.hp._plan(self._opts[prune][i], e, prec, zero, ch, True)
                     for i, ((e, _), ch) in enumerate(zip(envs, chosen))]
        else:
            plans = [self.hp.plan(e, prec, prune, act) for e, _ in envs]
        qos_ok = all(p.fits and p.est_time_s <= q for p, (_, q) in zip(plans, envs))
        return SearchResult(m, prune, prec, plans, True, qos_ok, self._steps)
