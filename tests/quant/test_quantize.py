"""Integer convention of the per-channel quantizer (the packed format relies on it)."""
from __future__ import annotations

import numpy as np
import pytest

from quant.quantize import dequantize_rows, fake_quant_act, quantize_rows


def test_codes_range_scale_and_error():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((16, 100)).astype(np.float32)
    w[3] = 0.0
    bits = np.arange(16) % 8 + 1
    q, scale = quantize_rows(w, bits)
    assert q.dtype == np.int8 and scale.dtype == np.float32 and q.shape == w.shape and scale.shape == (16,)
    qm = (1 << (bits - 1)) - 1
    assert (np.abs(q) <= qm[:, None]).all()
    assert (q[bits == 1] == 0).all() and (scale[bits == 1] == 0).all()    # B = 1: channel dequantizes to zero
    assert (q[3] == 0).all() and scale[3] == 0 and np.isfinite(scale).all()
    err = np.abs(dequantize_rows(q, scale) - w)
    ok = bits >= 2
    assert (err[ok] <= scale[ok, None] / 2 + 1e-6).all()
    nz = ok & (np.abs(w).max(axis=1) > 0)
    assert (np.abs(q[nz]).max(axis=1) == qm[nz]).all()                    # the max element uses the top code


def test_bits_8_is_per_channel_int8():
    w = np.array([[0.5, -1.0, 0.25]], dtype=np.float32)
    q, s = quantize_rows(w, 8)
    assert q.tolist() == [[64, -127, 32]] and s[0] == pytest.approx(1.0 / 127)


def test_bad_bits():
    with pytest.raises(ValueError, match="bits"):
        quantize_rows(np.ones((2, 2)), 0)
    with pytest.raises(ValueError, match="bits"):
        quantize_rows(np.ones((2, 2)), [8, 9])


def test_act_quant_saturates():
    x = np.array([0.0, 1.0, -3.0], dtype=np.float32)
    np.testing.assert_allclose(fake_quant_act(x, 1.0 / 127), [0.0, 1.0, -1.0])
    assert (fake_quant_act(x, 0.0) == 0).all()
