"""The W8A8 forward of a packed file with the runner's native kernels, in one thread, one op after the other
(docs/hil.md "Logits").

The same rules as the NumPy reference (`quant.packed_forward`, which owns them), computed by the kernels the runner
calls (`native.compute`): the runner must reproduce these logits bit for bit whatever its plan — its loaders,
unpackers, two compute workers, stealing and GEMM splits change when and where an op runs, never its arithmetic.
Against the NumPy reference itself the runner can only be judged on a tolerance: the float kernels differ from NumPy
by a few ulps (docs/hil.md "Native compute kernels"), and static INT8 activations turn such a difference into a
changed INT8 code now and then (one SmolLM2 prompt: logits 2.0 apart after a flip in layer 12).
"""
from __future__ import annotations

import numpy as np

import native.compute as nc
from quant.arch import ModelSpec
from quant.llama import rope_tables
from quant.packed_forward import QMAX, PackedModel, embed


def _linear(pm: PackedModel, name: str, x: np.ndarray) -> np.ndarray:
    a = float(np.float32(pm.act_scales[name]))
    acc = nc.gemm_i8_i32(nc.quantize_i8(x, a), pm.q[name])
    return nc.dequant_i32(acc, a, pm.scales[name])


def native_last_logits(pm: PackedModel, spec: ModelSpec, tokens, all_positions: bool = False) -> np.ndarray:
    """Logits (vocab,) float32 of the last prompt token, every op a native kernel (module doc); all_positions:
    (T, vocab), every position's, each row through the LM head alone (its own dynamic activation scale), as the
    runner's last row."""
    tokens = np.asarray(tokens, dtype=np.int64)
    if tokens.ndim != 1 or tokens.size == 0:
        raise ValueError(f"tokens must be a non-empty 1-D array (got shape {tokens.shape})")
    T, H, KV, hd, eps = tokens.size, spec.n_heads, spec.n_kv_heads, spec.head_dim, float(spec.norm_eps)
    x = np.ascontiguousarray(embed(pm, tokens), dtype=np.float32)               # (T, d)
    cos, sin = (np.ascontiguousarray(t) for t in rope_tables(T, hd, spec.rope_base))
    for i in range(spec.n_layers):
        p = f"blk.{i}."
        h = nc.rmsnorm(x, pm.floats[p + "attn_norm.weight"], eps)
        q = np.ascontiguousarray(_linear(pm, p + "attn_q.weight", h).reshape(T, H, hd))
        k = np.ascontiguousarray(_linear(pm, p + "attn_k.weight", h).reshape(T, KV, hd))
        v = np.ascontiguousarray(_linear(pm, p + "attn_v.weight", h).reshape(T, KV, hd))
        nc.rope(q, cos, sin)
        nc.rope(k, cos, sin)
        o = nc.attention(q, k, v, 0)                                             # the cache holds exactly T rows
        x = nc.add(x, _linear(pm, p + "attn_output.weight", o))
        h = nc.rmsnorm(x, pm.floats[p + "ffn_norm.weight"], eps)
        g = _linear(pm, p + "ffn_gate.weight", h)
        u = _linear(pm, p + "ffn_up.weight", h)
        s = nc.silu_mul(g, np.ones_like(g))
        np.multiply(s, u, out=s)                                                 # the runner's `mul` (NumPy)
        x = nc.add(x, _linear(pm, p + "ffn_down.weight", s))
    rows = range(T) if all_positions else [T - 1]
    out = [_lm_head(pm, nc.rmsnorm(np.ascontiguousarray(x[t:t + 1]), pm.floats["output_norm.weight"], eps))
           for t in rows]
    return np.stack(out) if all_positions else out[0]


def _lm_head(pm: PackedModel, hf: np.ndarray) -> np.ndarray:
    e = "token_embd.weight"
    a = float(np.float32(nc.absmax(hf)) / np.float32(QMAX))
    return nc.dequant_i32(nc.gemm_i8_i32(nc.quantize_i8(hf, a), pm.q[e]), a, pm.scales[e])[0]
