"""Statistical twin: the stored parameters are what the real model gives; sampling shapes, determinism, allocation."""
from __future__ import annotations

import json

import numpy as np
import pytest

from quant.arch import model_spec
from quant.twin import (
    SMOOTH_ALPHA,
    Twin,
    bits_histogram,
    fit_twin,
    kind_of,
    load_twin,
    smoothing_scales,
    twin_bits,
    twin_channel_stats,
    twin_path,
)
from tests.quant.conftest import needs_model


@needs_model
def test_stored_twin_matches_refit_from_real_model(smol, smol_weights):
    from quant.twin_fit import calibration_in_max

    stored = json.loads(twin_path().read_text())
    in_max, how = calibration_in_max(smol, smol_weights)
    refit = json.loads(fit_twin(smol_weights, smol.name, smoothing_scales(smol, in_max), SMOOTH_ALPHA, how).to_json())
    assert refit == stored


def test_twin_allocation_spread_near_fig4a():
    """EdgeFlow Fig. 4a (Llama3-8B, adaptive 5 bits, per-channel average budget): 11.5 / 77.7 / 9.9 % of channels at
    4 / 5 / 6 bits. The twin, fitted on smoothed weights, must not collapse onto the budget (> 88 % at 5 bits makes
    adaptive bits look uniform) and must put channels on both sides of it."""
    from quant.allocate import allocate

    spec = model_spec("llama3_8b")
    stats = twin_channel_stats(spec, seed=0)
    m = np.concatenate([v[0] for v in stats.values()])
    s = np.concatenate([v[1] for v in stats.values()])
    hist = bits_histogram(allocate(m, s, 5.0))
    assert hist[5] <= 0.88
    assert hist[4] >= 0.05 and hist[6] >= 0.05


def test_twin_json_roundtrip():
    t = load_twin()
    assert Twin.from_json(t.to_json()) == t
    assert set(t.log_z) == {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"}
    for q in t.log_z.values():
        assert all(np.all(np.diff(b) >= 0) for b in q)               # quantiles are sorted


def test_kind_mapping():
    assert kind_of("attn_v") == "attn_v" and kind_of("expert7_down") == "ffn_down"
    assert kind_of("shared_up") == "ffn_up" and kind_of("router") == "ffn_gate"
    with pytest.raises(ValueError):
        kind_of("conv")


def test_channel_stats_shapes_and_determinism():
    spec = model_spec("qwen1_5_1_8b")
    a = twin_channel_stats(spec, seed=3)
    b = twin_channel_stats(spec, seed=3)
    c = twin_channel_stats(spec, seed=4)
    for name, (out_c, d) in spec.linear_shapes().items():
        m, s = a[name]
        assert m.shape == s.shape == (spec.n_layers * out_c,)
        crest = m / np.sqrt(s)
        assert (crest >= 1.0).all() and (crest <= np.sqrt(d)).all()  # any real row satisfies 1 <= κ <= √D
        assert (m == b[name][0]).all() and not (m == c[name][0]).all()


def test_twin_bits_global_budget():
    spec = model_spec("qwen1_5_1_8b")
    bits = twin_bits(spec, 5.0, seed=0)
    shapes = spec.linear_shapes()
    tot_bits = sum(float(bits[n].astype(np.int64).sum()) * shapes[n][1] for n in bits)
    tot_w = sum(bits[n].size * shapes[n][1] for n in bits)
    assert 4.99 <= tot_bits / tot_w <= 5.0
    hist = bits_histogram(np.concatenate(list(bits.values())))
    assert abs(sum(hist.values()) - 1) < 1e-9 and hist[5] > 0.5
    per_tensor = twin_bits(spec, 5.0, seed=0, scope="tensor")
    assert all(abs(v.reshape(spec.n_layers, -1).mean(axis=1) - 5.0).max() < 1e-3 for v in per_tensor.values())
