"""Memory and communication accounting recomputed from first principles (model shapes, ggml bytes per weight, the
802.11 table), independently of the planner's vectorised tables: a bug in `layers.py` / `hybrid._reserve` /
`comm.py` shows up here even when the planner is self-consistent."""
from __future__ import annotations

import numpy as np
import pytest

from planner.voltron.plan import TP
from quant.arch import model_spec
from tests.voltron.helpers import links, policy

BPW = {0: 2.0, 1: 8.5 / 8, 2: 4.5 / 8}          # FP16, Q8_0, Q4_K bytes per weight (ggml)


def _expected_mem(spec, plan, n_tokens, head_precision=1, ffn_shards=32):
    """Per-device resident bytes: weights of the held shards + their KV cache slice + workspace + norm gains +
    head/embeddings."""
    d, q, kv = spec.d_model, spec.n_heads * spec.head_dim, spec.n_kv_heads * spec.head_dim
    D = len(plan.devices)
    mem = np.zeros(D)
    for j in range(2 * spec.n_layers):
        block, is_ffn = divmod(j, 2)
        p = int(plan.precision[j])
        if not is_ffn:
            weights = d * q + 2 * d * kv + q * d
            tokens = plan.kv_plan
            if spec.is_swa_layer(block):
                tokens = min(tokens, spec.sliding_window)
            kv_bytes = tokens * 2 * kv * 2.0                      # K and V, FP16
            shards = spec.n_kv_heads
        elif spec.n_experts:
            weights = (spec.n_experts * 3 * d * spec.d_expert_ffn + 3 * d * spec.d_shared_expert_ffn
                       + spec.n_experts * d)
            kv_bytes, shards = 0.0, spec.n_experts
        else:
            weights, kv_bytes, shards = 3 * d * spec.d_ffn, 0.0, ffn_shards
        mem += plan.shards[j] * (weights * BPW[p] + kv_bytes) / shards
    widest = max(spec.d_ffn, spec.d_expert_ffn * spec.n_experts_active + spec.d_shared_expert_ffn, q)
    norms = 2 * spec.n_layers * d * 4.0                           # fp32 RMSNorm gains, every sublayer (upper bound)
    mem += np.where(plan.budget_bytes > 0, n_tokens * (d + widest) * 4.0 * 2 + norms, 0.0)
    mem[0] += spec.vocab * d * (1 if spec.tied_embeddings else 2) * BPW[head_precision]
    return mem


@pytest.mark.parametrize("model", ["qwen2_5_14b", "qwen1_5_14b", "gemma3_12b", "qwen1_5_moe_a2_7b"])
def test_plan_memory_matches_first_principles(model):
    pol = policy(model)
    spec = model_spec(model)
    rng = np.random.default_rng(3)
    for phase, n, kv in ((1, 1, 3000), (0, 300, 1500), (1, 1, 200)):
        env = pol.env(phase, n, kv, links(-50, -50), pol.ctx.cluster.budgets())
        prec = rng.integers(0, 3, pol.ctx.table.n)
        plan = pol.hp.plan(env, prec, prune_frac=0.25 if phase else 0.0)
        assert plan.fits
        np.testing.assert_allclose(plan.mem_bytes, _expected_mem(spec, plan, n), rtol=1e-9)
        assert (plan.mem_bytes <= plan.budget_bytes * (1 + 1e-9)).all()


def test_all_weights_accounted():
    """Layer weights + LM head + untied embedding table = the model's parameter count (minus norm vectors)."""
    from planner.voltron.layers import layer_table

    for model in ("qwen2_5_14b", "gemma3_12b", "qwen1_5_moe_a2_7b", "qwen1_5_7b"):
        spec = model_spec(model)
        tb = layer_table(spec)
        counted = tb.params[tb.type_of].sum() + tb.params[5] + tb.embed_params
        norms = spec.n_layers * 2 * spec.d_model + spec.d_model
        assert counted == spec.total_params() - norms, model


def test_tp_and_mp_communication_formula():
    """TP layer = Σ_remote 2·bytes/goodput + 2·max latency (broadcast + aggregate); MP boundary = a hop per side."""
    pol = policy("qwen2_5_14b")
    lk = links(-45, -70)                     # MCS 9 (≥ −54 dBm) and MCS 3 (≥ −71 dBm) on a 40 MHz channel
    gp = np.array([360, 108]) * 1e6 / 8 * 0.6                 # bytes/s (VHT40 2SS rates × MAC efficiency)
    lat = (0.8 + 2.0 * (9 - np.array([9, 3])) / 9) * 1e-3     # s one-way
    nb = 5120 * 2.0                                           # one decode token of FP16 activations
    both = np.array([[True, True, True]])
    assert lk.tp_comm(np.array([nb]), both)[0] == pytest.approx((2 * nb / gp).sum() + 2 * lat.max())
    assert lk.tp_comm(np.array([nb]), np.array([[True, True, False]]))[0] == pytest.approx(2 * nb / gp[0]
                                                                                        + 2 * lat[0])
    hop = lk.hop(np.array([nb]))                              # (1, D)
    strat = np.array([0, 1, 1, 2, TP, 0])                     # main → 1 → 2 → main (TP aggregates on main)
    act = np.zeros(6, dtype=np.int64)
    expect = (nb / gp[0] + lat[0]) + (nb / gp[0] + lat[0] + nb / gp[1] + lat[1]) + (nb / gp[1] + lat[1])
    assert pol.hp.boundary_comm(strat, act, hop) == pytest.approx(expect)
    down = links(-45, -85)
    assert np.isinf(down.tp_comm(np.array([nb]), both)[0])    # a TP member behind a dead link cannot be used
    # independent links (the emulated cluster's one veth per device): the airtimes overlap, max instead of Σ
    from planner.voltron.comm import LinkState
    from planner.voltron.rssi import RssiTable

    own = LinkState.from_rssi(RssiTable(shared_channel=False), np.array([-45.0, -70.0]))
    assert not own.shared and own.tp_comm(np.array([nb]), both)[0] == pytest.approx((2 * nb / gp).max()
                                                                                     + 2 * lat.max())
    with pytest.raises(ValueError, match="shared_channel"):
        RssiTable(shared_channel="no")
