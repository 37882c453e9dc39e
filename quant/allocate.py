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
- `allocate_vectorized`: the same order without a loop. With integer costs (1, or the weights of a channel) every
  partial sum of costs is exact in any order, so the cost of "all steps with key < v" is a per-channel count times
  its cost: the steps below a bracket around where the budget runs out (estimated from a sample) are taken whole,
  and only the band inside it is sorted and walked. Other costs sort every step. Since hull gains are non-increasing
  per channel and ties are broken by (i, B), the heap pops exactly the globally sorted step sequence, so both forms
  return identical allocations. The gain table is built in blocks of channels that stay in cache.
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


BLOCK = 1 << 14   # channels per block of the gain kernel: its (bits, block) float64 arrays (8 x 16384 x 8 B = 1 MiB
                  # each) stay in cache and are reused, so the 1.4M channels of an 8B model allocate no full-size
                  # temporaries (each fresh full-size array costs its page faults again)


def _hull_gains_block(re_t: np.ndarray, hull: np.ndarray, buf: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Convexified per-bit gains (n-1, w) of one block's RE table `re_t` (n, w), in the buffers given.

    In one dimension the convex envelope at x is the minimum over chords (a <= x <= c) of the linear interpolation
    between (a, re[a]) and (c, re[c]); n <= 8, so the chords are enumerated vectorised over channels, every interior
    point of a chord in one call. Each element sees the float operations re[a] + (re[c] - re[a])·t in the same order
    whatever the block size, so the gains do not depend on it."""
    n = re_t.shape[0]
    hull[:] = re_t
    xs = np.arange(n, dtype=np.float64)
    for a in range(n):
        for c in range(a + 2, n):
            t = ((xs[a + 1:c] - a) / (c - a))[:, None]                               # (c-a-1, 1)
            chord = buf[:c - a - 1]
            np.multiply(re_t[c] - re_t[a], t, out=chord)
            np.add(re_t[a], chord, out=chord)
            np.minimum(hull[a + 1:c], chord, out=hull[a + 1:c])
    np.subtract(hull[:-1], hull[1:], out=g)
    for r in range(1, n - 1):                                                         # running minimum: exact
        np.minimum(g[r], g[r - 1], out=g[r])                                          # monotonicity
    return g


def _gain_blocks(max_abs, mean_sq, min_bits: int, max_bits: int, re: np.ndarray | None):
    """(channel slice, its convexified gains (n-1, w) in (bits, channels) layout) block by block; the gains array is
    a reused buffer, valid until the next block. The closed form is elementwise, so it is evaluated block by block
    directly in this layout."""
    b = np.arange(min_bits, max_bits + 1)
    if re is not None:
        re = np.asarray(re, dtype=np.float64)
        C, n = re.shape
    else:
        C, n = max_abs.size, b.size
    w = min(BLOCK, max(C, 1))
    hull, buf, g = np.empty((n, w)), np.empty((max(n - 2, 1), w)), np.empty((n - 1, w))
    for i0 in range(0, C, w):
        i1 = min(i0 + w, C)
        if re is not None:
            re_t = re[i0:i1].T
        else:
            re_t = re_closed_form(max_abs[None, i0:i1], mean_sq[None, i0:i1], b[:, None])
        k = i1 - i0
        yield slice(i0, i1), _hull_gains_block(re_t, hull[:, :k], buf[:, :k], g[:, :k])


def _table_shape(max_abs, min_bits: int, max_bits: int, re: np.ndarray | None) -> tuple[int, int]:
    """(steps, C) of the gain table."""
    if re is not None:
        return np.shape(re)[1] - 1, np.shape(re)[0]
    return max_bits - min_bits, max_abs.size


def _gains_t(max_abs, mean_sq, min_bits: int, max_bits: int, re: np.ndarray | None) -> np.ndarray:
    """(n-1, C) convexified gains in (bits, channels) layout."""
    out = np.empty(_table_shape(max_abs, min_bits, max_bits, re))
    for sl, g in _gain_blocks(max_abs, mean_sq, min_bits, max_bits, re):
        out[:, sl] = g
    return out


def _keys_t(max_abs, mean_sq, min_bits: int, max_bits: int, re: np.ndarray | None,
            cost: np.ndarray | None) -> tuple[np.ndarray, bool]:
    """The greedy's sort keys -(gain / cost) (cost None: -gain) (n-1, C), and whether every positive gain kept a
    negative key (False when a quotient underflowed to zero)."""
    out = np.empty(_table_shape(max_abs, min_bits, max_bits, re))
    signs_kept = True
    for sl, g in _gain_blocks(max_abs, mean_sq, min_bits, max_bits, re):
        key = out[:, sl]
        if cost is None:
            np.negative(g, out=key)
        else:
            np.divide(g, cost[sl], out=key)
            np.negative(key, out=key)
            signs_kept = signs_kept and np.count_nonzero(g > 0.0) == np.count_nonzero(key < 0.0)
    return out, signs_kept


def convex_gains(re: np.ndarray) -> np.ndarray:
    """Per-bit gains of the lower convex hull of each row of `re` (C, n) -> (C, n-1), non-increasing along axis 1."""
    return np.ascontiguousarray(_gains_t(None, None, 0, 0, np.asarray(re, dtype=np.float64)).T)


def gain_table(max_abs, mean_sq, min_bits: int = 1, max_bits: int = 8, re: np.ndarray | None = None) -> np.ndarray:
    """(C, max_bits - min_bits) convexified per-bit RE gains from the closed form (or from a given RE table)."""
    m = np.asarray(max_abs, dtype=np.float64).ravel() if re is None else None
    s = np.asarray(mean_sq, dtype=np.float64).ravel() if re is None else None
    return np.ascontiguousarray(_gains_t(m, s, min_bits, max_bits, re).T)


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
    """Start of the heap form: (bits at min_bits (C,) int8, gains (C, n-1) or None if nothing to do, costs)."""
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
    """Same allocation as `allocate_heap`, computed with a threshold on the keys (scales to ~1.5M channels)."""
    m, s = _check(max_abs, mean_sq, budget, min_bits, max_bits)
    bits = np.full(m.size, min_bits, dtype=np.int8)
    if m.size == 0 or max_bits == min_bits:
        return bits
    C = m.size
    c = _costs(cost, C)
    key, signs_kept = _keys_t(m, s, min_bits, max_bits, re, c)                        # (steps, C)
    c = np.ones(C) if c is None else c
    remain = _extra_budget(budget, min_bits, float(c.sum()))
    add = _steps_integer_costs(key, c, remain) if signs_kept else None
    if add is None:
        add = _steps_sorted(key, _gains_t(m, s, min_bits, max_bits, re), c, remain)
    return bits + add


def _count_below(key: np.ndarray, v: float) -> np.ndarray:
    """Per channel, the number of its steps with key < v (C,) int8: a prefix of its steps, since a channel's keys are
    non-decreasing in B."""
    n = np.zeros(key.shape[1], dtype=np.int8)
    for row in key:
        n += row < v
    return n


def _steps_sorted(key: np.ndarray, g: np.ndarray, c: np.ndarray, remain: float) -> np.ndarray:
    """Steps taken per channel with any positive costs: every step sorted by (key, channel, B) and walked."""
    steps, C = key.shape
    flat, gflat = key.T.ravel(), g.T.ravel()                                         # (channel, B) order
    order = np.argsort(flat, kind="stable")                                           # ties by (channel, B)
    gpos = gflat[order] > 0.0
    fits = np.cumsum(np.repeat(c, steps)[order]) <= remain
    stop = np.flatnonzero(~(gpos & fits))
    k = int(stop[0]) if stop.size else order.size
    return np.bincount(order[:k] // steps, minlength=C).astype(np.int8)


EXACT_SUM = 2.0 ** 52      # integer-valued float64 sums below this are exact in any order
BAND_SAMPLE = 64           # the steps of every 64th channel estimate where the budget runs out
BAND_MARGIN = 256          # sample steps either side of the estimate sorted exactly (x4 until it brackets)


def _cost_below(key: np.ndarray, c: np.ndarray, v: float) -> float:
    """Σ cost of the steps with key < v: exact for integer costs whose total is below EXACT_SUM (every product and
    partial sum is an integer float, so the order of the dot product's additions does not matter)."""
    return float(np.dot(_count_below(key, v).astype(np.float64), c))


def _steps_integer_costs(key: np.ndarray, c: np.ndarray, remain: float) -> np.ndarray | None:
    """Steps taken per channel by the sorted walk, without sorting every step, when every cost is an integer
    (weights per channel): then every partial sum of costs is exact whatever the order of addition, so the cost of
    "every step with key < v" equals the walk's cumulative cost there. Steps with key < v_lo (their total fits) are
    all taken, steps with key >= v_hi (their total does not fit) none; only the band in between is sorted by
    (key, channel, B) and walked. None when a cost is not an integer or the total could round; the caller then
    sorts everything (as it does when a positive gain has a zero key: its quotient underflowed, so it sorts among the
    zero gains, where the walk ends)."""
    steps, C = key.shape
    if not (np.all(c == np.floor(c)) and float(c.sum()) * steps < EXACT_SUM):
        return None
    pos = _count_below(key, 0.0)                                                      # gain > 0: the walk never
    if float(np.dot(pos.astype(np.float64), c)) <= remain:                            # takes another step
        return pos
    ks = key[:, ::BAND_SAMPLE]                                                        # every 64th channel, all steps
    cs = np.broadcast_to(c[::BAND_SAMPLE], ks.shape)[ks < 0.0]
    ks = ks[ks < 0.0]
    order = np.argsort(ks, kind="stable")
    sample = ks[order]
    est = min(int(np.searchsorted(np.cumsum(cs[order]) * BAND_SAMPLE, remain)), sample.size - 1)
    margin = BAND_MARGIN
    while True:
        lo = sample[est - margin] if est - margin > 0 else -np.inf
        hi = sample[est + margin] if est + margin < sample.size else 0.0
        below = _cost_below(key, c, lo)
        if below <= remain and (hi == 0.0 or _cost_below(key, c, hi) > remain):
            break
        margin *= 4
    band = [np.flatnonzero((row >= lo) & (row < hi)) for row in key]                 # row by row: no full-size masks
    i = np.concatenate(band)
    B = np.repeat(np.arange(steps), [b.size for b in band])
    order = np.lexsort((i * steps + B, key[B, i]))                                    # by key, then (channel, B)
    fits = below + np.cumsum(c[i[order]]) <= remain
    k = int(np.argmin(fits)) if not fits.all() else order.size
    return _count_below(key, lo) + np.bincount(i[order[:k]], minlength=C).astype(np.int8)


def allocate(max_abs, mean_sq, budget: float, min_bits: int = 1, max_bits: int = 8, *, cost=None,
             re: np.ndarray | None = None) -> np.ndarray:
    """The allocator the quantizer uses (vectorised form)."""
    return allocate_vectorized(max_abs, mean_sq, budget, min_bits, max_bits, cost=cost, re=re)
