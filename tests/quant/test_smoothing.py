"""Smoothing: the scales fold into norms / preceding rows exactly, and β (output side) leaves the weights unchanged."""
from __future__ import annotations

import numpy as np

from quant.allocate import allocate
from quant.evaluate import eval_text_tokens
from quant.llama import LinearHook, forward_logits
from quant.quantize import fake_quant_rows
from quant.relerr import channel_stats
from quant.smoothing import smooth_weight, tie_gqa
from tests.quant.conftest import needs_model


def test_beta_changes_nothing_in_the_dequantized_weights():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 96)).astype(np.float32)
    s_out = rng.lognormal(0, 2, 64).astype(np.float32)
    wp = smooth_weight(w, None, s_out)
    b0 = allocate(*channel_stats(w), 4.5)
    b1 = allocate(*channel_stats(wp), 4.5)
    assert (b0 == b1).all()
    np.testing.assert_allclose(fake_quant_rows(wp, b1) * s_out[:, None], fake_quant_rows(w, b0), rtol=1e-5, atol=1e-7)


class _Smoothed(LinearHook):
    """Divide the inputs of the listed linears by s and multiply their weight columns by s (what smoothing does)."""

    def __init__(self, scales):
        self.scales = scales

    def __call__(self, name, x, w):
        s = self.scales.get(name)
        return x @ w.T if s is None else (x / s) @ (w * s[None, :]).T


@needs_model
def test_input_scales_fold_exactly(smol, smol_weights):
    """Folding s into attn_norm (q/k/v), into v's rows (attn_output, GQA-tied) and into up's rows (down) is exact."""
    rng = np.random.default_rng(1)
    toks = eval_text_tokens(smol, 16)
    p = "blk.2."
    s_qkv = rng.lognormal(0, 0.5, smol.d_model).astype(np.float32)
    s_o = tie_gqa(rng.lognormal(0, 0.5, smol.q_dim), smol).astype(np.float32)
    s_down = rng.lognormal(0, 0.5, smol.d_ffn).astype(np.float32)
    s_gu = rng.lognormal(0, 0.5, smol.d_model).astype(np.float32)
    # (a) simulated at the linear inputs, as the quantizer does
    hook = _Smoothed({p + "attn_q.weight": s_qkv, p + "attn_k.weight": s_qkv, p + "attn_v.weight": s_qkv,
                      p + "attn_output.weight": s_o, p + "ffn_down.weight": s_down,
                      p + "ffn_gate.weight": s_gu, p + "ffn_up.weight": s_gu})
    a = forward_logits(smol_weights, smol, toks, hook)
    # (b) folded into the model: norm weights / s (q/k/v, gate/up), v rows / s (one KV head serves its query group),
    #     up rows / s (down)
    w = dict(smol_weights)
    w[p + "attn_norm.weight"] = smol_weights[p + "attn_norm.weight"] / s_qkv
    w[p + "ffn_norm.weight"] = smol_weights[p + "ffn_norm.weight"] / s_gu
    for k, s in (("attn_q", s_qkv), ("attn_k", s_qkv), ("attn_v", s_qkv), ("attn_output", s_o), ("ffn_down", s_down),
                 ("ffn_gate", s_gu), ("ffn_up", s_gu)):
        w[p + k + ".weight"] = smol_weights[p + k + ".weight"] * s[None, :]
    group = smol.n_heads // smol.n_kv_heads
    s_v = s_o.reshape(smol.n_kv_heads, group, smol.head_dim)[:, 0, :].reshape(-1)      # (kv_dim,)
    w[p + "attn_v.weight"] = w[p + "attn_v.weight"] / s_v[:, None]
    w[p + "ffn_up.weight"] = w[p + "ffn_up.weight"] / s_down[:, None]
    b = forward_logits(w, smol, toks)
    ref = forward_logits(smol_weights, smol, toks)
    np.testing.assert_allclose(a, b, rtol=2e-3, atol=2e-3)
    np.testing.assert_allclose(a, ref, rtol=2e-3, atol=2e-3)     # and smoothing alone changes nothing


def test_tie_gqa_is_constant_within_groups(smol):
    rng = np.random.default_rng(2)
    t = tie_gqa(rng.random(smol.q_dim), smol).reshape(smol.n_kv_heads, -1, smol.head_dim)
    assert (t == t[:, :1, :]).all()
