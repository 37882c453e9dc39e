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
