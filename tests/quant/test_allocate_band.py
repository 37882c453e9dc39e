"""The weighted-cost allocation sorts only a band around where the budget runs out when costs are integers
(`quant.allocate._taken_integer_costs`): the same allocation as Algorithm 1's heap, on sizes where the band is a small
part of the steps, with ties, zero gains and budgets from nearly nothing to everything."""
from __future__ import annotations

import numpy as np
import pytest

from quant.allocate import _taken_integer_costs, allocate_heap, allocate_vectorized, gain_table


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
    g = gain_table(m, s, 1, 8)
    c = rng.choice([64.0, 4096.0], C)
    key = (-(g / c[:, None])).ravel()
    assert _taken_integer_costs(key, g, c, 7, 2.0 * c.sum()) is not None
    assert _taken_integer_costs(key, g, c + 0.5, 7, 2.0 * c.sum()) is None
