"""Greedy per-output-channel bit allocation (EdgeFlow §4.1, Algorithm 1) in two equivalent forms.

Problem: minimise Σ_i RE_i(B_i) subject to Σ_i c_i·B_i <= budget·Σ_i c_i, B_i ∈ {min_bits..max_bits}, where c_i is the
storage cost of one bit of channel i (1 = "average bits per channel", the paper's per-tensor form; or the channel's
number of weights D_i, for a budget in bits per weight across tensors of different widths).

Convexification (why greedy is optimal here): the paper's argument needs RE gains that decrease with B. With the closed
form they do not always: RE(1) = 1 (channel zeroed) while the clamped closed form at B = 2 can also be 1 for
heavy-tailed channels, so the gain 1→2 is 0 and the gain 2→3 positive. We therefore allocate on each channel's LOWER
CONVEX HULL of the points (B, RE(B)): the per-bit hull gains g_i(B) = H_i(B) - H_i(B+1) are non-increasing in B
(enforced exactly with a running minimum, so float rounding cannot reorder them). Greedy over hull steps is optimal for
the convexified problem, and the hull equals RE at every hull vertex, so whenever every channel ends on a vertex
(always, except possibly the channel(s) taking the last steps of a multi-bit hull segment) the allocation is optimal for
the original problem. `tests/quant/test_allocate.py` checks both statements against brute force, including non-monotone
cases.

Order: every unit step (channel i, from B to B+1) has the key (-g_i(B)/c_i, i, B); steps are taken in increasing key
order while the gain is > 0 (a bit that reduces no error is not spent) and the cumulative cost fits the budget (the
first step that does not fit ends the allocation, as Algorithm 1's loop does).
- `allocate_heap`: Algorithm 1 with a binary max-heap, O(C log C + K log C) for K steps.
- `allocate_vectorized`: the same order without a loop: a threshold on the gains (np.partition) for unit costs, a
  stable sort + cumulative sum for weighted costs (integer costs, the weights of a channel: only the band of steps
  around where the budget runs out is sorted, since integer partial sums are exact in any order). Since hull gains
  are non-increasing per channel and ties are broken by (i, B), the heap pops exactly the globally sorted step
  sequence, so both forms return identical allocations.
"""
from __future__ import annotations

import heapq

import numpy as np

from quant.relerr import re_closed_form

BUDGET_EPS = 1e-9   # bits; absorbs float rounding in budget·C so that e.g. budget 4.5 over 2 channels gives 9 bits


def _check(max_abs, mean_sq, budget: float, min_bits: int, max_bits: int) -> tuple[np.ndarray, np.ndarray]:
    if not (1 <= min_bits <= max_bits <= 8):
        raise ValueError(f"min_bits/max_bits must satisfy 1 <= min_bits <= max_bits <= 8 (got {min_bits}, {max_bits})")
    if not np.isfinite(budget) or budget < min_bits:
        raise ValueError(f"budget must be >= min_bits={min_bits} bits (got {budget})")
    m = np.asarray(max_abs, dtype=np.float64).ravel()
    s = np.asarray(mean_sq, dtype=np.float64).ravel()
    if m.shape != s.shape:
        raise ValueError(f"max_abs and mean_sq must have the same length ({m.size} != {s.size})")
    return m, s


def _convex_gains_t(re_t: np.ndarray) -> np.ndarray:
    """`convex_gains` on the transposed table (n, C) -> (n-1, C): each bit width's row is contiguous, so every chord
    is a pass over contiguous memory (the same float operations element by element, so the same gains)."""
    n = re_t.shape[0]
    hull = re_t.copy()
    xs = np.arange(n, dtype=np.float64)
    for a in range(n):
        for c in range(a + 2, n):
            t = (xs[a + 1:c] - a) / (c - a)                                          # (c-a-1,)
            d = re_t[c] - re_t[a]
            for x, tx in zip(range(a + 1, c), t):
                np.minimum(hull[x], re_t[a] + d * tx, out=hull[x])
    g = hull[:-1] - hull[1:]
    return np.minimum.accumulate(g, axis=0)                                          # exact monotonicity


def convex_gains(re: np.ndarray) -> np.ndarray:
    """Per-bit gains of the lower convex hull of each row of `re` (C, n) -> (C, n-1), non-increasing along axis 1.

    In one dimension the convex envelope at x is the minimum over chords (a <= x <= c) of the linear interpolation
    between (a, re[a]) and (c, re[c]); n <= 8, so the 28 chords are enumerated vectorised over channels.
    """
    re = np.asarray(re, dtype=np.float64)
    return np.ascontiguousarray(_convex_gains_t(np.ascontiguousarray(re.T)).T)


def gain_table(max_abs, mean_sq, min_bits: int = 1, max_bits: int = 8, re: np.ndarray | None = None) -> np.ndarray:
    """(C, max_bits - min_bits) convexified per-bit RE gains from the closed form (or from a given RE table). The
    closed form is elementwise, so it is evaluated directly in the (bits, channels) layout the hull works in."""
    if re is not None:
        return convex_gains(re)
    b = np.arange(min_bits, max_bits + 1)
    re_t = re_closed_form(np.asarray(max_abs)[None, :], np.asarray(mean_sq)[None, :], b[:, None])
    return np.ascontiguousarray(_convex_gains_t(re_t).T)


def _extra_budget(budget: float, min_bits: int, total: float) -> float:
    """Storage allowed above min_bits everywhere; ONE expression for both forms, so they agree to the last ulp."""
    return (budget - min_bits) * total + BUDGET_EPS


def _costs(cost, C: int) -> np.ndarray | None:
    if cost is None:
        return None
    c = np.asarray(cost, dtype=np.float64).ravel()
    if c.shape != (C,) or (c <= 0).any():
        raise ValueError(f"cost must be {C} positive numbers")
    return None if (c == 1).all() else c


def _setup(max_abs, mean_sq, budget, min_bits, max_bits, cost, re):
    """Shared start of both forms: (bits at min_bits (C,) int8, gains (C, n-1) or None if nothing to do, costs)."""
    m, s = _check(max_abs, mean_sq, budget, min_bits, max_bits)
    bits = np.full(m.size, min_bits, dtype=np.int8)
    if m.size == 0 or max_bits == min_bits:
        return bits, None, None
    return bits, gain_table(m, s, min_bits, max_bits, re), _costs(cost, m.size)           # (C,), (C, n-1), (C,)|None


def allocate_heap(max_abs, mean_sq, budget: float, min_bits: int = 1, max_bits: int = 8, *,
                  cost=None, re: np.ndarray | None = None) -> np.ndarray:
    """Algorithm 1 (max-heap). Returns bits (C,) int8 with Σ c_i B_i <= budget Σ c_i."""
    bits, g, c = _setup(max_abs, mean_sq, budget, min_bits, max_bits, cost, re)
    if g is None:
        return bits
    C = bits.size
    cw = np.ones(C) if c is None else c
    key = g / cw[:, None]                                                             # gain per unit of storage
    total = cw.sum()
    remain = _extra_budget(budget, min_bits, total)                                   # extra storage allowed
    steps = g.shape[1]
    heap = [(-key[i, 0], i, 0) for i in range(C)]
    heapq.heapify(heap)
    keyl, gl, cwl = key.tolist(), g.tolist(), cw.tolist()
    added = [0] * C
    while heap:
        negk, i, b = heap[0]                                                          # the max-gain step
        if gl[i][b] <= 0.0 or cwl[i] > remain:
            break
        remain -= cwl[i]
        added[i] += 1
        if b + 1 < steps:
            heapq.heapreplace(heap, (-keyl[i][b + 1], i, b + 1))                      # pop + push in one sift
        else:
            heapq.heappop(heap)
    return bits + np.asarray(added, dtype=np.int8)


def allocate_vectorized(max_abs, mean_sq, budget: float, min_bits: int = 1, max_bits: int = 8, *,
                        cost=None, re: np.ndarray | None = None) -> np.ndarray:
    """Same allocation as `allocate_heap`, computed with a threshold on the gains (scales to ~1.5M channels)."""
    bits, g, c = _setup(max_abs, mean_sq, budget, min_bits, max_bits, cost, re)
    if g is None:
        return bits
    C = bits.size
    steps = g.shape[1]
    if c is None:
        k_max = int(np.floor(_extra_budget(budget, min_bits, float(C))))               # unit steps allowed
        flat = (-g).ravel()                                                           # key order = (flat value, index)
        n_pos = int(np.count_nonzero(flat < 0.0))                                     # steps with gain > 0
        k = min(k_max, n_pos)
        if k <= 0:
            return bits
        if k == flat.size:
            taken = np.ones(flat.size, dtype=bool)
        else:
            tau = np.partition(flat, k - 1)[k - 1]                                     # k-th smallest key value
            taken = flat < tau
            need = k - int(taken.sum())
            ties = np.flatnonzero(flat == tau)[:need]                                  # ties in (i, B) order
            taken[ties] = True
    else:
        key = (-(g / c[:, None])).ravel()
        remain = _extra_budget(budget, min_bits, float(c.sum()))
        taken = _taken_integer_costs(key, g, c, steps, remain)
        if taken is None:
            order = np.argsort(key, kind="stable")                                    # ties by flat index = (i, B)
            gpos = g.ravel()[order] > 0.0
            cost_steps = np.repeat(c, steps)[order]
            fits = np.cumsum(cost_steps) <= remain
            stop = np.flatnonzero(~(gpos & fits))
            k = int(stop[0]) if stop.size else order.size
            taken = np.zeros(order.size, dtype=bool)
            taken[order[:k]] = True
    bits += taken.reshape(C, steps).sum(axis=1).astype(np.int8)
    return bits


EXACT_SUM = 2.0 ** 52      # integer-valued float64 sums below this are exact in any order
BAND_SAMPLE = 64           # every 64th step estimates where the budget runs out
BAND_MARGIN = 256          # sample steps either side of the estimate sorted exactly (x4 until it brackets)


def _taken_integer_costs(key: np.ndarray, g: np.ndarray, c: np.ndarray, steps: int,
                         remain: float) -> np.ndarray | None:
    """The steps the sorted walk takes, without sorting them all, when every cost is an integer (weights per
    channel): then every partial sum of costs is exact whatever the order of addition, so the cost of "every step with
    key < v" equals the walk's cumulative cost there. Steps with key < v_lo (their total fits) are all taken, steps
    with key >= v_hi (their total does not fit) none; only the band in between is sorted by (key, index) and walked.
    None when a cost is not an integer, the total could round, or a positive gain has a zero key (its quotient
    underflowed: it sorts among the zero gains); the caller then sorts everything."""
    if not (np.all(c == np.floor(c)) and float(c.sum()) * steps < EXACT_SUM):
        return None
    pos = key < 0.0                                      # gain > 0: the walk never takes another step
    if not np.array_equal(pos, g.ravel() > 0.0):
        return None
    cost = np.repeat(c, steps)
    if float(cost[pos].sum()) <= remain:
        return pos
    ks, cs = key[pos][::BAND_SAMPLE], cost[pos][::BAND_SAMPLE]
    order = np.argsort(ks, kind="stable")
    sample = ks[order]
    est = min(int(np.searchsorted(np.cumsum(cs[order]) * BAND_SAMPLE, remain)), sample.size - 1)
    margin = BAND_MARGIN
    while True:
        lo = sample[est - margin] if est - margin > 0 else -np.inf
        hi = sample[est + margin] if est + margin < sample.size else 0.0
        below = key < lo
        if float(cost[below].sum()) <= remain and (hi == 0.0 or float(cost[key < hi].sum()) > remain):
            break
        margin *= 4
    band = np.flatnonzero(~below & (key < hi))           # increasing flat index: a stable sort orders ties by it
    band = band[np.argsort(key[band], kind="stable")]
    fits = float(cost[below].sum()) + np.cumsum(cost[band]) <= remain
    k = int(np.argmin(fits)) if not fits.all() else band.size
    taken = below
    taken[band[:k]] = True
    return taken


def allocate(max_abs, mean_sq, budget: float, min_bits: int = 1, max_bits: int = 8, *, cost=None,
             re: np.ndarray | None = None) -> np.ndarray:
    """The allocator the quantizer uses (vectorised form)."""
    return allocate_vectorized(max_abs, mean_sq, budget, min_bits, max_bits, cost=cost, re=re)
