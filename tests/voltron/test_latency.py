"""Latency regression: fitted on simulated profiles, accurate on held-out points, deterministic for a seed."""
from __future__ import annotations

import numpy as np

from planner.voltron.devices import device_time, load_cluster
from planner.voltron.latency import fit_for, simulate_profiles
from planner.voltron.layers import layer_table
from quant.arch import model_spec


def test_heldout_accuracy_and_determinism():
    c = load_cluster("car")
    tb = layer_table(model_spec("gemma3_4b"))
    m1, acc1 = fit_for(c.devices, tb, points=96, seed=3)
    m2, acc2 = fit_for(c.devices, tb, points=96, seed=3)
    assert np.array_equal(m1.beta, m2.beta) and acc1 == acc2
    assert acc1["accuracy"] >= 0.85 and acc1["r2"] >= 0.95            # paper: ~90 % accuracy is enough to rank MP/TP
    assert (m1.beta >= 0).all()                                        # NNLS: no negative costs


def test_noise_free_profiles_match_roofline():
    c = load_cluster("home")
    tb = layer_table(model_spec("qwen2_5_3b"))
    prof = simulate_profiles(c.devices, tb, points=8, noise=0.0, seed=0)
    for i in range(0, len(prof.time_s), 7):
        dev = c.devices[prof.device[i]]
        x = prof.x[i]
        n = prof.n_tokens[i] if prof.ltype[i] != 5 else 1
        assert np.isclose(prof.time_s[i], device_time(dev, np.array(prof.prec[i]), np.array(float(n)), x[1],
                                                      x[2] + x[3]))


def test_decode_memory_bound_prefill_compute_bound():
    dev = load_cluster("office").devices[0]
    tb = layer_table(model_spec("qwen2_5_7b"))
    f1, _ = tb.features(1, 0)
    f2, _ = tb.features(512, 0)
    t = lambda f, n, p: device_time(dev, np.array(p), np.array(float(n)), f[3, 0], f[3, 1] * [2, 1.0625, 0.5625][p])  # noqa: E731
    # decode: time ∝ bytes (INT4 ≈ 3.5x faster than FP16); prefill: compute-bound (INT4 no faster than INT8)
    assert t(f1, 1, 0) / t(f1, 1, 2) > 3.0
    assert t(f2, 512, 2) >= t(f2, 512, 1)


def test_layer_variants_in_the_table():
    from planner.voltron.layers import ATTN_GQA, ATTN_SWA, FFN_MOE

    g = layer_table(model_spec("gemma3_12b"))
    assert (g.type_of[0::2] == ATTN_SWA).sum() == 40 and (g.type_of[0::2] == ATTN_GQA).sum() == 8   # 5 local : 1 global
    _, kv = g.features(0, 8192)
    assert kv[ATTN_SWA] == 1024 * 2 * g.spec.kv_dim * 2 and kv[ATTN_GQA] == 8192 * 2 * g.spec.kv_dim * 2
    moe = layer_table(model_spec("qwen1_5_moe_a2_7b"))
    f1, _ = moe.features(1, 0)
    f512, _ = moe.features(512, 0)
    assert f1[FFN_MOE, 1] < 0.2 * moe.params[FFN_MOE]            # decode reads 4 of 60 experts (+ shared)
    assert f512[FFN_MOE, 1] > 0.99 * moe.params[FFN_MOE] * 0.999  # a 512-token batch touches every expert


def test_fit_by_layer_type_captures_type_specific_costs():
    """Two layer types with different per-op costs on one device: the pooled fit cannot match both, the per-type fit
    (paper: layer type is a regression feature) does, and `type_costs` gives each type's whole-layer time."""
    from planner.voltron.latency import LatencyModel, Profile

    rng = np.random.default_rng(0)
    rows = []
    for p in range(3):
        for ph in range(2):
            for t, per_op, b0 in ((1, 1e-9, 1e-3), (3, 5e-9, 4e-3)):   # per-type cost per op and fixed cost
                for _ in range(12):
                    ops = rng.uniform(1e5, 5e6)
                    rows.append((0, p, ph, t, 1, 0, np.array([1.0, ops, 0.0, 0.0]), b0 + per_op * ops))
    cols = list(zip(*rows))
    prof = Profile(*(np.array(c) for c in cols[:6]), x=np.stack(cols[6]), time_s=np.array(cols[7]))
    pooled = LatencyModel.fit(prof, ["dev"])
    typed = LatencyModel.fit(prof, ["dev"], by_type=True)
    err = lambda m: np.abs(m.predict(prof) - prof.time_s) / prof.time_s              # noqa: E731
    assert err(typed).max() < 1e-6 < 0.1 < err(pooled).max()
    feats = np.zeros((6, 3))
    feats[1, 0] = feats[3, 0] = 2e6                                                   # ops of a whole layer per type
    icpt, slope = typed.type_costs(0, feats)
    np.testing.assert_allclose(icpt[0, 1, [1, 3]] + slope[0, 1, [1, 3]], [1e-3 + 2e-3, 4e-3 + 1e-2], rtol=1e-6)
    # a TP shard (a quarter of the layer's ops) costs its own type's intercept + fraction x slope: the fitted model
    # (with one pooled intercept the two types' shards were off by their fixed costs' difference)
    half = Profile(*(np.array([0, 0]), np.array([1, 1]), np.array([0, 0]), np.array([1, 3]), np.array([1, 1]),
                     np.array([0, 0])), x=np.array([[1.0, 5e5, 0, 0]] * 2), time_s=np.ones(2))
    np.testing.assert_allclose(icpt[0, 1, [1, 3]] + 0.25 * slope[0, 1, [1, 3]], typed.predict(half), rtol=1e-9)
