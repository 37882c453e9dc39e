"""quant.measure_importance: the batched pruning forward agrees with the reference forward and with pruning through
a hook; the precision hooks implement the stated semantics; per-slice results are kept per slice."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tests.quant.conftest import needs_model


@pytest.fixture(scope="module")
def tiny(smol):
    return dataclasses.replace(smol, n_layers=3)                 # the first 3 blocks of the real model (fast)


@needs_model
def test_batched_trace_matches_forward(tiny, smol_weights):
    from quant.evaluate import eval_text_tokens, log_softmax
    from quant.llama import forward_logits
    from quant.measure_importance import reference_trace

    toks = eval_text_tokens(tiny, 24, 0)
    tr = reference_trace(smol_weights, tiny, toks)
    ref = log_softmax(forward_logits(smol_weights, tiny, toks))
    assert np.abs(tr["lp"] - ref).max() < 1e-4


@needs_model
def test_pruning_matches_prune_hook(tiny, smol_weights):
    from quant.evaluate import eval_text_tokens, kl_mean, perplexity_from_logits
    from quant.llama import forward_logits
    from quant.measure_importance import PruneHook, prune_slice, shard_columns

    toks = eval_text_tokens(tiny, 24, 0)
    res = prune_slice(smol_weights, tiny, toks, 4, [0, 1, 2])
    ref = forward_logits(smol_weights, tiny, toks)
    for sub, i, g in (("attn", 1, 2), ("ffn", 0, 3), ("ffn", 2, 0)):
        suffix, cols = shard_columns(tiny, sub, g, 4)
        q = forward_logits(smol_weights, tiny, toks, PruneHook(f"blk.{i}.{suffix}", cols))
        dppl, kl = res[sub][i][0][g], res[sub][i][1][g]
        assert dppl == pytest.approx(perplexity_from_logits(q, toks) - perplexity_from_logits(ref, toks),
                                     rel=1e-3, abs=1e-4)
        assert kl == pytest.approx(kl_mean(ref, q), rel=1e-3, abs=1e-6)
        assert kl > 0


@needs_model
def test_measure_keeps_slices_apart(tiny):
    from quant.evaluate import eval_slices
    from quant.measure_importance import measure

    sl = eval_slices(tiny, 4, 16, 0, 20_000)
    r = measure(tiny, sl, 4, layers=[1], progress=False)
    assert r["ffn_dppl"].shape == (4, 3, 4) and r["attn_kl"].shape == (4, 3, tiny.n_kv_heads)
    assert np.isnan(r["ffn_dppl"][:, 0]).all() and np.isfinite(r["ffn_dppl"][:, 1]).all()   # only layer 1 measured
    assert len(set(np.round(r["ref_ppl"], 6))) == 4                                        # four different slices
    assert not np.allclose(r["ffn_kl"][0, 1], r["ffn_kl"][1, 1])


def test_precision_semantics():
    from quant.arch import ModelSpec
    from quant.ggml_blocks import q4_k_roundtrip, q8_0_roundtrip, q8_k_roundtrip
    from quant.measure_importance import BLOCK_SHIFT, PRECISIONS, SEMANTICS, PrecisionHook, quantize_weight

    assert set(SEMANTICS) == set(PRECISIONS)
    rng = np.random.default_rng(0)
    w = rng.normal(size=(6, 256)).astype(np.float32)
    assert np.array_equal(quantize_weight(w, "fp16"), w.astype(np.float16).astype(np.float32))
    # llama.cpp formats: blocks offset by BLOCK_SHIFT from the shipped Q4_1 grid; context row on the grid itself
    assert np.array_equal(quantize_weight(w, "q8_0"), q8_0_roundtrip(w, BLOCK_SHIFT))
    assert np.array_equal(quantize_weight(w, "q4_k"), q4_k_roundtrip(w, BLOCK_SHIFT))
    assert np.array_equal(quantize_weight(w, "q4_k_aligned"), q4_k_roundtrip(w, 0))
    # host-kernel semantics: per-output-channel symmetric
    w4 = quantize_weight(w, "host_int4_per_channel")
    step = np.abs(w).max(axis=1, keepdims=True) / 7                      # |q| <= 7
    assert np.allclose(w4 / step, np.rint(w4 / step), atol=1e-4) and np.abs(w4 / step).max() <= 7 + 1e-4
    with pytest.raises(ValueError, match="precision"):
        quantize_weight(w, "int3")
    spec = ModelSpec(name="t", n_layers=1, d_model=256, d_ffn=64, n_heads=2, n_kv_heads=1, head_dim=16, vocab=10)
    ws = {f"blk.0.{k}.weight": w for k in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up",
                                             "ffn_down")}
    x = rng.normal(size=(5, 256)).astype(np.float32)
    x[0, 0] = 50.0                                                        # an outlier sets the dynamic scale
    y8 = PrecisionHook(ws, spec, "host_int8_w8a8")("blk.0.attn_q.weight", x, w)
    s = 50.0 / 127
    xq = np.clip(np.rint(x / s), -127, 127) * s                          # dynamic per-tensor INT8 of this input
    assert np.allclose(y8, xq @ quantize_weight(w, "host_int8_w8a8").T, atol=1e-4)
    wq = quantize_weight(w, "q8_0")
    assert np.array_equal(quantize_weight(w, "q8_0_weights_only"), wq)
    ya = PrecisionHook(ws, spec, "q8_0")("blk.0.ffn_up.weight", x, w)      # Q8_0 activation blocks, same grid
    assert np.allclose(ya, q8_0_roundtrip(x, BLOCK_SHIFT) @ wq.T, atol=1e-4) and not np.allclose(ya, x @ wq.T)
    assert np.allclose(PrecisionHook(ws, spec, "q8_0_weights_only")("blk.0.ffn_up.weight", x, w), x @ wq.T,
                       atol=1e-4)
    w4k = quantize_weight(w, "q4_k")
    y4 = PrecisionHook(ws, spec, "q4_k", "ffn")
    assert np.allclose(y4("blk.0.attn_q.weight", x, w), x @ w.T)        # ATTN untouched when scope = ffn
    assert np.allclose(y4("blk.0.ffn_up.weight", x, w), q8_k_roundtrip(x, BLOCK_SHIFT) @ w4k.T, atol=1e-4)
    y4w = PrecisionHook(ws, spec, "q4_k_weights_only", "ffn")
    assert np.allclose(y4w("blk.0.ffn_up.weight", x, w), x @ w4k.T, atol=1e-5)   # fp32 activations
    with pytest.raises(ValueError, match="precision"):
        PrecisionHook(ws, spec, "int8")


@needs_model
def test_only_precision_checks_the_existing_file(tmp_path, capsys):
    import json

    from quant.measure_importance import main

    with pytest.raises(SystemExit) as e:
        main(["--only", "precision", "--out", str(tmp_path / "missing.json")])
    assert e.value.code == 2 and "does not exist" in capsys.readouterr().err
    p = tmp_path / "other.json"
    p.write_text(json.dumps({"slices": {"count": 4, "tokens": 64, "offset": 0, "stride": 20000},
                             "attn_dppl_slices": [[[0.0]]]}))
    with pytest.raises(SystemExit) as e:
        main(["--only", "precision", "--out", str(p)])                   # default --tokens 128 ≠ the file's 64
    assert e.value.code == 2 and "other slices" in capsys.readouterr().err
