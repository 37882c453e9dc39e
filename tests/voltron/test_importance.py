"""Layer importance and the accuracy proxy from the committed SmolLM2 measurement (K disjoint slices): mean over
slices, the noise rule, the depth proxy labelled "extrapolated", the measured precision losses and their override."""
from __future__ import annotations

import json

import numpy as np
import pytest

from planner.voltron.accuracy import (
    AccuracyConfig,
    accuracy_proxy,
    loss_source,
    precision_loss,
    scaled_loss,
    weight_losses,
)
from planner.voltron.importance import NOISE_Z, importance_for, load_measurement, shard_stats
from quant.arch import model_spec


def _doc(tmp_path, attn, ffn, ref, prec=None, kl=None):
    """A measurement file with given per-slice Δppl arrays (K, L, G)."""
    attn, ffn = np.asarray(attn, float), np.asarray(ffn, float)
    doc = {"model": "smollm2_135m", "ref_ppl_slices": list(ref), "attn_dppl_slices": attn.tolist(),
           "ffn_dppl_slices": ffn.tolist(), "attn_kl_slices": (np.abs(attn) if kl is None else kl).tolist(),
           "ffn_kl_slices": np.abs(ffn).tolist(), "precision": prec or {}}
    p = tmp_path / "imp.json"
    p.write_text(json.dumps(doc))
    load_measurement.cache_clear()
    return str(p)


def test_committed_measurement_has_spread_over_slices():
    doc = load_measurement()
    sm = model_spec("smollm2_135m")
    K = len(doc["ref_ppl_slices"])
    assert K >= 4 and doc["slices"]["count"] == K
    offs, L = doc["slices"]["offsets"], doc["slices"]["tokens"]
    assert all(b - a >= L for a, b in zip(offs, offs[1:]))                    # disjoint slices
    c0, c1 = doc["slices"]["calibration_excluded"]
    assert all(o + L <= c0 or o >= c1 for o in offs)                          # and disjoint from calibration
    a = np.asarray(doc["attn_dppl_slices"])
    assert a.shape == (K, sm.n_layers, sm.n_kv_heads) and np.isfinite(a).all()
    assert not np.allclose(a[0], a[1])                                        # per-slice values differ
    for prec in ("fp16", "q8_0", "q4_k", "host_int8_w8a8", "host_int4_per_channel"):    # llama.cpp + host kernels
        for scope in ("all", "attn", "ffn"):
            assert len(doc["precision"][prec][scope]["ppl"]) == K
        assert prec in doc["precision_semantics"]


def test_noise_rule(tmp_path):
    # 4 slices, 1 layer, 3 shards: clear signal, a negative mean, and a positive mean within 2 standard errors
    attn = [[[1.0, -0.2, 0.5]], [[1.2, -0.1, -0.5]], [[0.8, 0.0, 0.6]], [[1.0, -0.3, -0.4]]]
    ffn = [[[2.0, 2.2]], [[2.1, 1.9]], [[1.9, 2.0]], [[2.0, 2.1]]]
    path = _doc(tmp_path, attn, ffn, ref=[10.0, 10.0, 10.0, 10.0])
    st = shard_stats(load_measurement(path), "attn")
    rel = np.asarray(attn)[:, 0, :] / 10.0
    assert np.allclose(st.mean[0], rel.mean(axis=0)) and np.allclose(st.sd[0], rel.std(axis=0, ddof=1))
    se = NOISE_Z * rel.std(axis=0, ddof=1) / 2
    assert rel.mean(axis=0)[2] > 0 and rel.mean(axis=0)[2] <= se[2]          # shard 2: positive but within noise
    assert st.noise[0].tolist() == [False, True, True]
    assert st.importance[0].tolist() == [pytest.approx(0.1), 0.0, 0.0]
    imp = importance_for(model_spec("qwen2_5_7b"), path)
    assert imp.source == "extrapolated" and imp.noise_share == pytest.approx(2 / 5)
    assert imp.noise_share_kind == {"attn": pytest.approx(2 / 3), "ffn": 0.0}
    load_measurement.cache_clear()


def test_measured_and_extrapolated():
    sm = model_spec("smollm2_135m")
    imp = importance_for(sm)
    assert imp.source == "measured" and imp.per_sublayer.shape == (2 * sm.n_layers,)
    assert 0 <= imp.noise_share < 1
    big = importance_for(model_spec("qwen2_5_14b"))
    assert big.source == "extrapolated" and np.isclose(big.per_sublayer.sum(), 1.0) and (big.per_sublayer > 0).all()
    # the proxy keeps the measured depth profile: the most important SmolLM2 block maps to the same relative depth
    top_small = np.argmax(imp.per_sublayer[1::2]) / sm.n_layers
    top_big = np.argmax(big.per_sublayer[1::2]) / 48
    assert abs(top_small - top_big) < 0.05
    f = np.linspace(0, 1, 9)
    share = imp.pruned_share(f)
    assert share[0] == 0 and np.isclose(share[-1], 1) and (np.diff(share) >= -1e-12).all()
    assert (share <= f + 1e-9).all()               # least-important shards first: never more than their share


def test_precision_loss_mapping(tmp_path):
    prec = {"q8_0": {"all": {"ppl": [12.0, 11.0, 13.0, 12.5], "ref_ppl": [10.0] * 4, "kl": [0.1, 0.2, 0.1, 0.2]}},
            "q4_k": {"all": {"ppl": [20.0, 22.0, 18.0, 21.0], "ref_ppl": [10.0] * 4, "kl": [0.5] * 4}},
            "host_int8_w8a8": {"all": {"ppl": [30.0] * 4, "ref_ppl": [10.0] * 4, "kl": [1.0] * 4}},
            "fp16": {"all": {"ppl": [10.01, 9.99, 10.0, 9.98], "ref_ppl": [10.0] * 4, "kl": [0.0] * 4}}}
    path = _doc(tmp_path, [[[1.0]]] * 4, [[[1.0]]] * 4, [10.0] * 4, prec)
    p8 = precision_loss("int8", path=path)
    want = np.mean([1 - 10 / 12, 1 - 10 / 11, 1 - 10 / 13, 1 - 10 / 12.5])   # 1 − ppl_ref/ppl, mean over slices
    assert p8.loss == pytest.approx(want) and p8.slices == 4 and p8.fmt == "q8_0"     # plan INT8 = llama.cpp Q8_0
    assert precision_loss("int4", path=path).fmt == "q4_k"
    assert precision_loss("host_int8_w8a8", path=path).loss == pytest.approx(1 - 10 / 30)   # other rows by name
    assert p8.dppl_rel == pytest.approx(np.mean([0.2, 0.1, 0.3, 0.25]))
    assert p8.kl == pytest.approx(0.15) and p8.kl_sd == pytest.approx(np.std([0.1, 0.2, 0.1, 0.2], ddof=1))
    assert precision_loss("fp16", path=path).loss == 0.0                     # within noise (mean < 0) → 0
    m = load_measurement(path)["model"]                                      # the measured model: its own q
    q = weight_losses(AccuracyConfig(), m, path)
    assert q[0] == 0 and q[1] == pytest.approx(want) and q[2] == pytest.approx(precision_loss("int4", path=path).loss)
    assert weight_losses(AccuracyConfig(loss_int8=0.002), m, path)[1] == 0.002   # config override wins
    with pytest.raises(ValueError, match="host_int8_weight_only/all"):
        precision_loss("host_int8_weight_only", path=path)
    load_measurement.cache_clear()


def test_accuracy_proxy_uses_size_scaled_constants_and_labels_them():
    """A 7.6B model's q(p) lies on the size curve through SmolLM2's measurement (135M) and the published llama.cpp
    points (LLaMA-7B / 13B): far below SmolLM2's Q4_K loss, near LLaMA-7B's."""
    spec = model_spec("qwen2_5_7b")
    imp = importance_for(spec)
    N = 2 * spec.n_layers
    z = np.zeros(N, int)
    l8, l4 = scaled_loss("int8", spec.total_params() / 1e9), scaled_loss("int4", spec.total_params() / 1e9)
    assert 0 <= l8 < 1e-3 and 0.015 < l4 < 0.025 < precision_loss("int4").loss
    small, big = scaled_loss("int4", 3.0), scaled_loss("int4", 14.8)
    assert precision_loss("int4").loss > small > l4 > big > 0                # monotone in size
    assert scaled_loss("int4", 6.74) == pytest.approx(1 - 5.9066 / 6.0215)    # the published point itself
    for p, loss in ((1, l8), (2, l4)):
        acc = accuracy_proxy(spec.name, imp, AccuracyConfig(), np.full(N, p), z, np.zeros(N))
        assert acc == pytest.approx(74.2 * (1 - loss))                        # whole model at p: base × (1 − q(p))
    acc = accuracy_proxy(spec.name, imp, AccuracyConfig(loss_int8=0.002, loss_int4=0.02), np.full(N, 1), z,
                         np.zeros(N))
    assert acc == pytest.approx(74.2 * 0.998)
    assert loss_source(spec.name, AccuracyConfig()) == "size-scaled (llama.cpp Q8_0, Q4_K)"
    assert loss_source("smollm2_135m", AccuracyConfig()) == "measured (llama.cpp Q8_0, Q4_K)"
    assert loss_source("smollm2_135m", AccuracyConfig(loss_int8=0.01)) == "measured (llama.cpp Q4_K; INT8 from config)"
    assert loss_source(spec.name, AccuracyConfig(loss_int8=0.01, loss_int4=0.1)) == "config"
    with pytest.raises(ValueError, match="accuracy.loss_int4"):
        AccuracyConfig(loss_int4=1.5)


def test_accuracy_proxy_prefers_lowering_unimportant_layers():
    spec = model_spec("qwen2_5_7b")
    imp = importance_for(spec)
    N = 2 * spec.n_layers
    order = imp.order()
    low, high = np.zeros(N, int), np.zeros(N, int)
    low[order[:10]] = 2                            # 10 least important to INT4
    high[order[-10:]] = 2                          # 10 most important to INT4
    z = np.zeros(N, int)
    a = lambda p: accuracy_proxy(spec.name, imp, AccuracyConfig(), p, z, np.zeros(N))  # noqa: E731
    assert a(z) == 74.2 and a(z) > a(low) > a(high)


@pytest.mark.slow
def test_remeasure_subset_matches_committed():
    """Re-measure two blocks of SmolLM2 on the committed slices; must match the JSON."""
    from quant.evaluate import eval_slices
    from quant.measure_importance import measure

    doc = load_measurement()
    spec = model_spec("smollm2_135m")
    s = doc["slices"]
    sl = eval_slices(spec, s["count"], s["tokens"], s["offset"], s["stride"])
    res = measure(spec, sl, doc["ffn_groups"], layers=[15, 28], progress=False)
    assert np.allclose(res["ref_ppl"], doc["ref_ppl_slices"], rtol=1e-4)
    for i in (15, 28):
        for key in ("attn_dppl", "ffn_dppl", "attn_kl", "ffn_kl"):
            assert np.allclose(res[key][:, i], np.asarray(doc[f"{key}_slices"])[:, i], rtol=1e-3, atol=1e-4)
