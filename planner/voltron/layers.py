"""Per-sublayer workload of a model for the Voltron planner (paper §2.1, §3.2.2 "model heterogeneity").

Owns the mapping ModelSpec → a table of *sublayers*: each transformer block contributes an ATTN sublayer (Q/K/V/O
projections + attention over the KV cache) and an FFN sublayer (dense SwiGLU or MoE), which the paper plans separately
(Fig. 5: MP vs TP differs between ATTN and FFN variants). Sublayer types:

    0 attn_mha   n_kv_heads == n_heads
    1 attn_gqa   grouped-query attention
    2 attn_swa   GQA with a sliding window (gemma-3 local layers): attention span and KV cache capped at the window
    3 ffn_dense  SwiGLU gate/up/down
    4 ffn_moe    router + routed experts (top-k) + shared expert; in a batch of n tokens the number of distinct experts
                 touched is E·(1 − (1 − k/E)^n) (uniform routing), which sets the weight bytes read
    5 head       final norm + LM head (vocab × d_model) on the main device (computed for the last token only)

All sublayers of one type have identical shapes, so costs are computed once per type (T ≤ 6) and indexed per sublayer:
that is what keeps re-planning vectorised and sub-millisecond.

TP shards (the unit the planner assigns and prunes): ATTN = one KV-head group (its query heads, K/V rows, O columns and
its slice of the KV cache); dense FFN = `ffn_shards` equal channel groups; MoE = one routed expert (the shared expert
and router are split proportionally). KV cache is FP16 (llama.cpp default).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from quant.arch import ModelSpec

TYPES = ("attn_mha", "attn_gqa", "attn_swa", "ffn_dense", "ffn_moe", "head")
ATTN_MHA, ATTN_GQA, ATTN_SWA, FFN_DENSE, FFN_MOE, HEAD = range(6)
KV_BYTES = 2.0          # bytes per KV element (FP16 cache)
ACT_WORK_BYTES = 4.0    # bytes per activation element in device workspaces (fp32 accumulators)
N_FEATURES = 4          # regression features: [1, ops, weight bytes read, KV bytes read]


@dataclass
class LayerTable:
    """Sublayers of one model. Arrays are indexed by sublayer j (N = 2·n_layers) or by type t (T = 6)."""
    spec: ModelSpec
    type_of: np.ndarray          # (N,) int type id per sublayer
    block_of: np.ndarray         # (N,) transformer block index
    depth: np.ndarray            # (N,) relative depth in [0, 1]
    params: np.ndarray           # (T,) resident weights per sublayer of that type (all experts)
    shards: np.ndarray           # (T,) TP shard count
    kv_per_token: np.ndarray     # (T,) resident KV bytes per cached token (0 for FFN)
    act_width: int               # d_model: activation elements per token on the wire
    ffn_width: int               # widest intermediate (workspace sizing)
    embed_params: int = 0        # token-embedding weights resident on the main device besides the LM head
                                 # (vocab × d_model when the embeddings are untied, 0 when tied: the head is the table)

    @property
    def n(self) -> int:
        return len(self.type_of)

    def features(self, n_tokens: int, kv_len: int) -> tuple[np.ndarray, np.ndarray]:
        """Per-type work for a batch of `n_tokens` new tokens with `kv_len` tokens already cached.

        Returns (ops (T,), weight_params_read (T,), kv_bytes_read (T,)) stacked as a (T, 3) array and the resident
        KV bytes per type (T,) after the batch. Ops: 2 per MAC.
        """
        s = self.spec
        n = float(n_tokens)
        d = s.d_model
        ops = np.zeros(len(TYPES))
        wread = np.zeros(len(TYPES))
        kvread = np.zeros(len(TYPES))
        kv_res = np.zeros(len(TYPES))
        attn_params = self.params[ATTN_GQA]
        for t, window in ((ATTN_MHA, 0), (ATTN_GQA, 0), (ATTN_SWA, s.sliding_window)):
            # mean attended context over the batch (causal): kv_len + (n + 1) / 2, capped by the window
            ctx = kv_len + (n + 1) / 2
            total = kv_len + n
            if window:
                ctx = min(ctx, window)
                total = min(total, window)
            ops[t] = 2 * n * attn_params + 4 * n * ctx * s.q_dim
            wread[t] = attn_params
            kvread[t] = total * 2 * s.kv_dim * KV_BYTES
            kv_res[t] = total * 2 * s.kv_dim * KV_BYTES
        if s.is_moe:
            e, k = s.n_experts, s.n_experts_active
            per_expert = 3 * d * s.d_expert_ffn
            shared = 3 * d * s.d_shared_expert_ffn + s.n_experts * d
            touched = e * (1 - (1 - k / e) ** n)
            ops[FFN_MOE] = 2 * n * (k * per_expert + shared)
            wread[FFN_MOE] = touched * per_expert + shared
        else:
            ops[FFN_DENSE] = 2 * n * self.params[FFN_DENSE]
            wread[FFN_DENSE] = self.params[FFN_DENSE]
        ops[HEAD] = 2 * 1 * self.params[HEAD]            # logits for the last token only
        wread[HEAD] = self.params[HEAD]
        return np.stack([ops, wread, kvread], axis=1), kv_res


def layer_table(spec: ModelSpec, ffn_shards: int = 32) -> LayerTable:
    """Build the sublayer table of `spec` (ATTN, FFN alternating per block)."""
    d = spec.d_model
    L = spec.n_layers
    if spec.attention_kind == "MHA":
        attn_t = np.full(L, ATTN_MHA)
    else:
        attn_t = np.full(L, ATTN_GQA)
    if spec.sliding_window > 0:
        attn_t = np.array([ATTN_SWA if spec.is_swa_layer(i) else attn_t[i] for i in range(L)])
    ffn_t = np.full(L, FFN_MOE if spec.is_moe else FFN_DENSE)
    type_of = np.empty(2 * L, dtype=np.int64)
    type_of[0::2], type_of[1::2] = attn_t, ffn_t
    block = np.repeat(np.arange(L), 2)
    params = np.zeros(len(TYPES))
    attn_params = d * (spec.q_dim + 2 * spec.kv_dim) + spec.q_dim * d
    params[[ATTN_MHA, ATTN_GQA, ATTN_SWA]] = attn_params
    if spec.is_moe:
        params[FFN_MOE] = (spec.n_experts * 3 * d * spec.d_expert_ffn + 3 * d * spec.d_shared_expert_ffn
                           + spec.n_experts * d)
    else:
        params[FFN_DENSE] = 3 * d * spec.d_ffn
    params[HEAD] = spec.vocab * d
    shards = np.ones(len(TYPES), dtype=np.int64)
    shards[[ATTN_MHA, ATTN_GQA, ATTN_SWA]] = spec.n_kv_heads
    shards[FFN_DENSE] = ffn_shards
    shards[FFN_MOE] = max(spec.n_experts, 1)
    kv_tok = np.zeros(len(TYPES))
    kv_tok[[ATTN_MHA, ATTN_GQA, ATTN_SWA]] = 2 * spec.kv_dim * KV_BYTES
    width = max(spec.d_ffn, spec.d_expert_ffn * max(spec.n_experts_active, 1) + spec.d_shared_expert_ffn, spec.q_dim)
    return LayerTable(spec=spec, type_of=type_of, block_of=block, depth=(block + 0.5) / L,
                      params=params, shards=shards, kv_per_token=kv_tok, act_width=d, ffn_width=width,
                      embed_params=0 if spec.tied_embeddings else spec.vocab * d)
