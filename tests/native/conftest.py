"""Shared test vectors and the force-one-ISA fixture for the native kernel tests (SimSIMD style)."""
import numpy as np
import pytest

import native


def random_codes(rng: np.random.Generator, bits: np.ndarray, D: int) -> np.ndarray:
    """(C,) bits -> q int8 (C, D) uniform over each channel's full signed range, extremes included."""
    C = bits.size
    lo = -(1 << (bits.astype(np.int64) - 1))
    hi = (1 << (bits.astype(np.int64) - 1)) - 1
    q = rng.integers(lo[:, None], hi[:, None] + 1, size=(C, D))
    if C and D >= 2:
        q[:, 0], q[:, -1] = lo, hi                     # both range ends in every channel
    return q.astype(np.int8)


@pytest.fixture(params=native.available_isas())
def isa(request):
    """Every ISA this machine runs, one at a time, forced globally for the duration of the test."""
    with native.force_isa(request.param):
        yield request.param
