"""The vectorised allocation sorts only a band around where the budget runs out when costs are integers
(`quant.allocate._steps_integer_costs`): the same allocation as Algorithm 1's heap, on sizes where the band is a small
part of the steps and the gain table spans several blocks, with ties, zero gains, underflowing keys and budgets from
nearly nothing to everything."""
from __future__ import annotations

import numpy as np
import pytest

from quant import allocate as alloc_mod
from quant.allocate import _keys_t, _steps_integer_costs, allocate_heap, allocate_vectorized


@pytest.mark.parametrize("seed", range(6))
def test_band_walk_equals_the_heap(seed):
    rng = np.random.default_rng(seed)
    C = 20_000
    m = rng.lognormal(0, 1, C)
    s = m**2 / rng.uniform(1, 80, C)
    s[rng.integers(0, C, C // 10)] = 0.0                       # all-zero channels: zero gains
    m[: C // 50] = m[C // 50: 2 * (C // 50)]                   # duplicated channels: tied keys
    s[: C // 50] = s[C // 50: 2 * (C // 50)]
    cost = rng.choice([64.0, 4096.0, 14336.0], C)
    lo, hi = (1, 8) if seed % 2 == 0 else (2, 6)
    for budget in (lo + 0.01, (lo + hi) / 2, hi - 0.3, float(hi)):
        want = allocate_heap(m, s, budget, lo, hi, cost=cost)
        assert np.array_equal(allocate_vectorized(m, s, budget, lo, hi, cost=cost), want), budget


def test_band_walk_is_used_for_integer_costs_only():
    rng = np.random.default_rng(7)
    C = 5000
    m, s = rng.lognormal(0, 1, C), rng.uniform(0.01, 1, C)
    c = rng.choice([64.0, 4096.0], C)
    key, signs_kept = _keys_t(m, s, 1, 8, None, c)
    assert signs_kept
    assert _steps_integer_costs(key, c, 2.0 * c.sum()) is not None
    assert _steps_integer_costs(key, c + 0.5, 2.0 * c.sum()) is None


@pytest.mark.parametrize("block", [7, 64, 1 << 14])
def test_block_size_changes_nothing(block, monkeypatch):
    rng = np.random.default_rng(11)
    C = 3000
    m = rng.lognormal(0, 1, C)
    s = m**2 / rng.uniform(1, 80, C)
    cost = rng.choice([576.0, 1536.0], C)
    want = [allocate_heap(m, s, b, cost=c) for b in (3.3, 5.0) for c in (None, cost)]
    monkeypatch.setattr(alloc_mod, "BLOCK", block)
    assert all(np.array_equal(allocate_vectorized(m, s, b, cost=c), w)
               for (b, c), w in zip([(b, c) for b in (3.3, 5.0) for c in (None, cost)], want))


def test_underflowing_keys_sort_among_the_zero_gains():
    """A positive gain smaller than cost x the least subnormal has key 0: the heap meets it among the zero-gain steps
    (in channel order) and takes it only if no zero-gain step comes first; the vectorised form must agree."""
    rng = np.random.default_rng(9)
    C = 400
    re = np.sort(rng.uniform(0.0, 1.0, (C, 8)), axis=1)[:, ::-1].copy()
    re[::7] = np.array([4e-320, 3e-320, 2e-320, 1e-320, 0.0, 0.0, 0.0, 0.0])       # subnormal gains: key underflows
    re[3::11] = 0.5                                                                     # zero gains
    m, s = np.ones(C), np.ones(C)
    cost = rng.choice([4096.0, 14336.0], C)
    key, signs_kept = _keys_t(m, s, 1, 8, re, cost)
    assert not signs_kept
    for budget in (1.5, 4.0, 7.0, 8.0):
        want = allocate_heap(m, s, budget, cost=cost, re=re)
        assert np.array_equal(allocate_vectorized(m, s, budget, cost=cost, re=re), want), budget
