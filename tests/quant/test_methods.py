"""Every method on the real model at toy size: NPU constraints respected, edge cases, bits=8 == plain INT8."""
from __future__ import annotations

import numpy as np
import pytest

from quant.calibrate import calibrate
from quant.evaluate import eval_text_tokens, kl_mean
from quant.llama import forward_logits
from quant.methods import METHODS
from quant.methods.cmpq import cmpq_bits
from quant.settings import QuantSettings
from tests.quant.conftest import needs_model

TOY = dict(calib_tokens=32, search_tokens=16, eval_tokens=32, alpha_steps=2)
N_LAYERS = 3      # the first blocks of SmolLM2 only: same tensors and code paths, a tenth of the time


@pytest.fixture(scope="module")
def smol3(smol):
    import dataclasses

    return dataclasses.replace(smol, n_layers=N_LAYERS)


@pytest.fixture(scope="module")
def calib(smol3, smol_weights):
    return calibrate(smol_weights, smol3, eval_text_tokens(smol3, 32, 100_000))


@pytest.fixture(scope="module")
def eval_ref(smol3, smol_weights):
    toks = eval_text_tokens(smol3, 32)
    return toks, forward_logits(smol_weights, smol3, toks)


@needs_model
@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_respects_npu_constraints(method, smol3, smol_weights, calib, eval_ref):
    st = QuantSettings(**TOY)
    qm = METHODS[method](st).build(smol_weights, smol3, calib, 5, 5.0)
    assert len(qm.layers) == 7 * smol3.n_layers
    for name, l in qm.layers.items():
        qmax = (1 << (l.bits.astype(np.int64) - 1)) - 1
        assert (np.abs(l.q.astype(np.int64)) <= qmax[:, None]).all(), name
        assert np.isscalar(l.act_scale) and l.act_scale > 0                 # static per-tensor activation scale
    b, d = qm.all_bits()
    want = {"int8": 8, "int4": 4}.get(method, 5)
    assert (b * d).sum() / d.sum() == pytest.approx(want, abs=1e-3)
    toks, ref = eval_ref
    kl = kl_mean(ref, forward_logits(smol_weights, smol3, toks, qm))
    assert 0 < kl < 5


@needs_model
def test_edgeflow_bits8_reproduces_plain_int8(smol3, smol_weights, calib, eval_ref):
    st = QuantSettings(**{**TOY, "smoothing": False, "beta": 0.0})
    ef = METHODS["edgeflow"](st).build(smol_weights, smol3, calib, 8, 8.0)
    i8 = METHODS["int8"](st).build(smol_weights, smol3, calib, 8, 8.0)
    for n in i8.layers:
        assert (ef.layers[n].bits == 8).all()
        assert (ef.layers[n].q == i8.layers[n].q).all() and (ef.layers[n].scale == i8.layers[n].scale).all()
    toks, _ = eval_ref
    assert (forward_logits(smol_weights, smol3, toks, ef) == forward_logits(smol_weights, smol3, toks, i8)).all()


@needs_model
def test_edgeflow_global_scope_spends_budget_by_weights(smol3, smol_weights, calib):
    st = QuantSettings(**{**TOY, "scope": "global", "alpha_steps": 1})
    qm = METHODS["edgeflow"](st).build(smol_weights, smol3, calib, 4, 4.5)
    b, d = qm.all_bits()
    assert 4.49 <= (b * d).sum() / d.sum() <= 4.5
    per_tensor = [l.bits.mean() for l in qm.layers.values()]
    assert max(per_tensor) - min(per_tensor) > 0.1                         # global: tensors differ


@needs_model
def test_shadow_outlier_paths(smol3, smol_weights, calib):
    qm = METHODS["shadow_outlier"](QuantSettings(**TOY)).build(smol_weights, smol3, calib, 6, 6.0)
    l = qm.layers["blk.0.attn_q.weight"]
    assert 0 < l.shadow_idx.size < 0.05 * smol3.d_model
    x = calib.inputs["blk.0.attn_q.weight"]
    assert np.abs(x[:, np.setdiff1d(np.arange(x.shape[1]), l.shadow_idx)]).max() <= l.shadow_clip + 1e-6
    assert l.weight_bytes() > qm.layers["blk.0.attn_q.weight"].q.size * 6 / 8     # FP16 columns counted


def test_cmpq_tiers():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((40, 64))
    w[:5, 0] = 20.0
    b = cmpq_bits(w, 4, 0.25, 0.25)
    assert b.mean() == 4 and set(b.tolist()) == {3, 4, 5} and (b[:5] == 5).all()
    assert (cmpq_bits(w, 8, 0.25, 0.25) == 8).all() and (cmpq_bits(w, 1, 0.25, 0.25) == 1).all()


@needs_model
def test_model_bytes_components(smol3, smol_weights, calib):
    qm = METHODS["int4"](QuantSettings(**TOY)).build(smol_weights, smol3, calib, 4, 4.0)
    want = 0.0
    for o, i in smol3.linear_shapes().values():
        want += smol3.n_layers * (o * i * 4 / 8 + o * 4 + o * 3 / 8 + 4)       # codes + f32 scale + 3-bit width + act
    want += (2 * smol3.n_layers + 1) * smol3.d_model * 4                      # f32 norms
    want += smol3.vocab * (smol3.d_model + 4)                                 # per-row INT8 embeddings (tied head)
    assert qm.model_bytes(smol3) == pytest.approx(want)


@needs_model
def test_edgeflow_exact_metric_allocates_like_closed_form_at_high_bits(smol3, smol_weights, calib):
    base = {**TOY, "alpha_steps": 1}
    ex = METHODS["edgeflow"](QuantSettings(**base, metric="exact")).build(smol_weights, smol3, calib, 6, 6.0)
    cf = METHODS["edgeflow"](QuantSettings(**base)).build(smol_weights, smol3, calib, 6, 6.0)
    for n in cf.layers:
        assert ex.layers[n].bits.mean() == pytest.approx(6.0, abs=1e-3)
        assert np.mean(ex.layers[n].bits == cf.layers[n].bits) > 0.8          # the two metrics mostly agree


def test_smoothquant_scale_is_xiao_eq4(smol):
    """s_j = max|X_j|^α / max|W_j|^(1-α) over all group members: at α = 0.5 it equalises the smoothed activation and
    weight ranges per input channel (SmoothQuant's defining property); attn_output's s is tied per GQA group."""
    from quant.methods.smoothquant import smoothquant_scale

    rng = np.random.default_rng(0)
    names = ["blk.0.attn_q.weight", "blk.0.attn_k.weight"]
    w = {n: rng.standard_normal((c, 96)).astype(np.float32) * rng.lognormal(0, 1, 96).astype(np.float32)
         for n, c in zip(names, (40, 20))}
    x_max = {names[0]: rng.lognormal(0, 2, 96).astype(np.float32)}
    s = smoothquant_scale(names, w, x_max, smol, 0.5)
    w_max = np.maximum(np.abs(w[names[0]]).max(0), np.abs(w[names[1]]).max(0))
    np.testing.assert_allclose(x_max[names[0]] / s, w_max * s, rtol=1e-5)
    np.testing.assert_allclose(smoothquant_scale(names, w, x_max, smol, 1.0), x_max[names[0]], rtol=1e-6)
    o = "blk.0.attn_output.weight"
    t = smoothquant_scale([o], {o: rng.standard_normal((8, smol.q_dim))}, {o: rng.random(smol.q_dim) + 0.1}, smol, 0.5)
    t = t.reshape(smol.n_kv_heads, -1, smol.head_dim)
    assert (t == t[:, :1, :]).all()


@needs_model
@pytest.mark.parametrize("method", ["edgeflow", "smoothquant"])
def test_zeroed_channels_quantize_without_nan(method, smol3, smol_weights, eval_ref):
    """Pruned (all-zero) output rows: zero scales, no division by zero in RE, smoothing (S_O = 0, and the dead
    ffn_down input channels they cause: S_I = 0) or the act scale; the quantized forward stays finite."""
    w = dict(smol_weights)
    for k in ("blk.0.ffn_up.weight", "blk.1.attn_q.weight"):
        w[k] = w[k].copy()
        w[k][:50] = 0.0
    cal = calibrate(w, smol3, eval_text_tokens(smol3, 32, 100_000))
    assert (cal.in_max["blk.0.ffn_down.weight"][:50] == 0).all()              # dead input channels downstream
    qm = METHODS[method](QuantSettings(**TOY)).build(w, smol3, cal, 4, 4.0)
    for k in ("blk.0.ffn_up.weight", "blk.1.attn_q.weight"):
        l = qm.layers[k]
        assert (l.q[:50] == 0).all() and (l.scale[:50] == 0).all() and np.isfinite(l.w_hat).all()
        if method == "edgeflow":
            assert (l.bits[:50] == 1).all() and l.bits.mean() == pytest.approx(4.0, abs=1e-3)
    assert all(np.isfinite(l.w_hat).all() and np.isfinite(l.act_scale) for l in qm.layers.values())
    toks, ref = eval_ref
    assert np.isfinite(kl_mean(ref, forward_logits(w, smol3, toks, qm)))
