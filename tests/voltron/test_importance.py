"""Layer importance: measured on SmolLM2 (committed JSON), depth proxy for large models, accuracy proxy ordering."""
from __future__ import annotations

import numpy as np
import pytest

from planner.voltron.accuracy import AccuracyConfig, accuracy_proxy
from planner.voltron.importance import importance_for, load_measurement
from quant.gguf_model import model_spec


def test_measured_and_proxy():
    doc = load_measurement()
    sm = model_spec("smollm2_135m")
    assert len(doc["attn_shards"]) == sm.n_layers and len(doc["attn_shards"][0]) == sm.n_kv_heads
    imp = importance_for(sm)
    assert imp.source == "measured" and imp.per_sublayer.shape == (2 * sm.n_layers,)
    big = importance_for(model_spec("qwen2_5_14b"))
    assert big.source == "depth-proxy" and np.isclose(big.per_sublayer.sum(), 1.0) and (big.per_sublayer > 0).all()
    # the proxy keeps the measured depth profile: the most important SmolLM2 block maps to the same relative depth
    top_small = np.argmax(imp.per_sublayer[1::2]) / sm.n_layers
    top_big = np.argmax(big.per_sublayer[1::2]) / 48
    assert abs(top_small - top_big) < 0.05
    f = np.linspace(0, 1, 9)
    share = imp.pruned_share(f)
    assert share[0] == 0 and np.isclose(share[-1], 1) and (np.diff(share) >= -1e-12).all()
    assert (share <= f + 1e-9).all()               # least-important shards first: never more than their share


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
    """Re-measure two blocks of SmolLM2 with the committed settings; must match the JSON."""
    from quant.evaluate import eval_text_tokens
    from quant.measure_importance import measure

    doc = load_measurement()
    spec = model_spec("smollm2_135m")
    toks = eval_text_tokens(spec, doc["tokens"], doc["offset"])
    res = measure(spec, toks, doc["ffn_groups"], layers=[0, 15], progress=False)
    assert res["base_ppl"] == pytest.approx(doc["base_ppl"], rel=1e-4)
    for i in (0, 15):
        assert np.allclose(res["shards"]["attn"][str(i)], doc["attn_shards"][i], rtol=1e-3, atol=1e-3)
        assert np.allclose(res["shards"]["ffn"][str(i)], doc["ffn_shards"][i], rtol=1e-3, atol=1e-3)
