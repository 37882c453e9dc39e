"""NumPy reference forward of a packed model file: the golden output of the HIL runner (docs/hil.md "Runner").

Owns the W8A8 run-time semantics of a file written by `quant.export` (EdgeFlow §4.1: smoothing folded into the norms
and per-channel scales, static per-tensor INT8 activations on every linear input, the NPU constraint):
- per linear `n`: x8 = clip(rint(x / act_scale[n]), ±127) (float32 division, round half to even), acc = x8 @ q^T
  exactly in int32, y = float32(acc) * float32(act_scale[n] * scale[c]) (the scale product in float32);
- token embedding = the tied LM head, per-row INT8 + one float32 scale per row: x = float32(q[tok]) * scale[tok];
- LM head on the last prompt token: dynamic per-tensor activation scale a = max|h| / 127, then the linear rule with
  the embedding rows as weights and their row scales;
- norms, RoPE (adjacent pairs), causal grouped-query attention and SwiGLU in float32 (`quant.llama`).
The integer parts are exact, so a runner that follows these rules differs only by float32 rounding of the non-linear
ops (and the rare INT8 rounding-boundary flip that such a difference causes).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from quant.arch import ModelSpec
from quant.llama import apply_rope, rope_tables, silu
from quant.llama import rms_norm as _rms_norm
from quant.pack import PackedFile

QMAX = 127


@dataclass
class PackedModel:
    """A packed file in memory: INT8 weights (C, D), per-channel float32 scales (C,), act scales, float32 tensors."""
    q: dict[str, np.ndarray]         # name -> (C, D) int8
    scales: dict[str, np.ndarray]    # name -> (C,) float32 (smoothing folded)
    floats: dict[str, np.ndarray]    # norms: name -> float32 array
    act_scales: dict[str, float]     # linear name -> static per-tensor activation scale
    meta: dict


def read_model(path: str | Path, backend: str = "native") -> PackedModel:
    """Read every tensor of a packed file (CRC-checked, unpacked to INT8 with `backend`)."""
    q, sc, fl = {}, {}, {}
    with PackedFile(path) as f:
        meta = dict(f.meta)
        for n in f.names():
            v = f.read_tensor(n, backend=backend)
            if isinstance(v, tuple):
                q[n], sc[n] = v[0], np.asarray(v[2], dtype=np.float32)
            else:
                fl[n] = v
    act = meta.get("act_scales")
    if not isinstance(act, dict):
        raise ValueError(f"{path}: metadata has no act_scales (write the file with quant.export.write_pack)")
    return PackedModel(q, sc, fl, {k: float(v) for k, v in act.items()}, meta)


def quantize_act(x: np.ndarray, scale: float) -> np.ndarray:
    """x float32 (..., D) -> int8 codes clip(rint(x / scale), ±127); scale <= 0 -> zeros."""
    if scale <= 0:
        return np.zeros(x.shape, dtype=np.int8)
    return np.clip(np.rint(x / np.float32(scale)), -QMAX, QMAX).astype(np.int8)


def gemm_i8(x8: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Exact int32 x8 (M, K) @ w (N, K)^T (float64 BLAS: |sums| < 2^53, so exact) -> (M, N) int32."""
    return (x8.astype(np.float64) @ w.astype(np.float64).T).astype(np.int32)


def dequant(acc: np.ndarray, x_scale: float, w_scale: np.ndarray) -> np.ndarray:
    """acc (M, N) int32 -> float32(acc) * float32(x_scale * w_scale[n]) (product in float32)."""
    return acc.astype(np.float32) * (np.float32(x_scale) * w_scale.astype(np.float32))


def linear(pm: PackedModel, name: str, x: np.ndarray) -> np.ndarray:
    """The W8A8 linear `name` on x (T, D) float32 -> (T, C) float32."""
    a = pm.act_scales[name]
    return dequant(gemm_i8(quantize_act(x, a), pm.q[name]), a, pm.scales[name])


def embed(pm: PackedModel, tokens: np.ndarray) -> np.ndarray:
    """Prompt rows of the INT8 embedding -> (T, d) float32."""
    e = "token_embd.weight"
    return pm.q[e][tokens].astype(np.float32) * pm.scales[e][tokens][:, None]


def lm_head(pm: PackedModel, h: np.ndarray) -> np.ndarray:
    """h (1, d) float32 (after the final norm) -> logits (vocab,) float32, dynamic per-tensor activation scale."""
    e = "token_embd.weight"
    a = float(np.float32(np.abs(h).max()) / np.float32(QMAX))
    return dequant(gemm_i8(quantize_act(h, a), pm.q[e]), a, pm.scales[e])[0]


def forward_last_logits(pm: PackedModel, spec: ModelSpec, tokens, nudge: bool = False,
                        all_positions: bool = False) -> np.ndarray:
    """Logits (vocab,) float32 of the last token of `tokens` (T,) after a causal W8A8 forward over the prompt;
    all_positions: (T, vocab), every position's logits, each row with its own LM-head activation scale.

    nudge: move every float input of an INT8 quantization (the RMSNorm outputs, the attention output, the SwiGLU
    product) up by one float32 ulp — the reference's own float-rounding noise. Static INT8 activations make the
    forward chaotic under such noise (a value crossing a rounding boundary changes an INT8 code); the difference of
    the two runs is the scale on which another float32 implementation (the runner) can be judged. (Nudging only the
    RMSNorm outputs missed the crossings another attention kernel's ~1e-6 differences cause: on one SmolLM2 prompt
    it gave 4e-6 while the runner, exact in every integer step, differed by 2.0 from a crossing in layer 12.)"""
    tokens = np.asarray(tokens, dtype=np.int64)
    if tokens.ndim != 1 or tokens.size == 0:
        raise ValueError(f"tokens must be a non-empty 1-D array (got shape {tokens.shape})")
    if tokens.min() < 0 or tokens.max() >= spec.vocab:
        raise ValueError(f"tokens: ids must be in 0..{spec.vocab - 1}")
    if not spec.tied_embeddings:
        raise ValueError(f"model {spec.name}: the packed runtime stores the tied embedding as the LM head only")
    T, H, KV, hd, eps = tokens.size, spec.n_heads, spec.n_kv_heads, spec.head_dim, spec.norm_eps
    group = H // KV

    def nudged(y):                                                              # float32, optionally one ulp up
        y = y.astype(np.float32)
        return np.nextafter(y, np.float32(np.inf)) if nudge else y

    def rms_norm(x, g, eps):
        return nudged(_rms_norm(x, g, eps))

    x = embed(pm, tokens)                                                        # (T, d)
    cos, sin = rope_tables(T, hd, spec.rope_base)                                # (T, hd/2)
    mask = np.triu(np.full((T, T), -np.inf, dtype=np.float32), k=1)              # (T, T) causal
    scale = np.float32(1.0 / np.sqrt(hd))
    for i in range(spec.n_layers):
        p = f"blk.{i}."
        h = rms_norm(x, pm.floats[p + "attn_norm.weight"], eps).astype(np.float32)
        q = apply_rope(linear(pm, p + "attn_q.weight", h).reshape(T, H, hd), cos, sin)
        k = apply_rope(linear(pm, p + "attn_k.weight", h).reshape(T, KV, hd), cos, sin)
        v = linear(pm, p + "attn_v.weight", h).reshape(T, KV, hd)
        qh = q.transpose(1, 0, 2).reshape(KV, group * T, hd)                      # (KV, group*T, hd)
        att = (qh @ k.transpose(1, 2, 0)).reshape(KV, group, T, T) * scale + mask  # (KV, group, T, T)
        att = np.exp(att - att.max(axis=-1, keepdims=True))
        att /= att.sum(axis=-1, keepdims=True)
        o = att.reshape(KV, group * T, T) @ v.transpose(1, 0, 2)                 # (KV, group*T, hd)
        o = nudged(o.reshape(KV, group, T, hd).transpose(2, 0, 1, 3).reshape(T, H * hd))
        x = x + linear(pm, p + "attn_output.weight", o)
        h = rms_norm(x, pm.floats[p + "ffn_norm.weight"], eps).astype(np.float32)
        g = linear(pm, p + "ffn_gate.weight", h)                                 # (T, f)
        u = linear(pm, p + "ffn_up.weight", h)
        x = x + linear(pm, p + "ffn_down.weight", nudged(silu(g) * u))
    rows = range(T) if all_positions else [T - 1]
    out = [lm_head(pm, rms_norm(x[t:t + 1], pm.floats["output_norm.weight"], eps).astype(np.float32))  # (1, d)
           for t in rows]
    return np.stack(out) if all_positions else out[0]
