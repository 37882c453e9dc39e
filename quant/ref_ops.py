"""NumPy references (golden outputs) of the native compute kernels of the host runner (native/compute.py;
EdgeFlow paper §3.2 / §4.1: W8A8 linear layers with per-output-channel INT8 weights and static per-tensor INT8
activations, float32 Llama ops on the CPU; docs/hil.md "Native compute kernels").

Same names and argument order as native/compute.py (without `out=` / `isa=`). The math is the one of the model
reference: rms_norm, apply_rope and silu are imported from quant/llama.py and the activation codes are those of
quant/quantize.py fake_quant_act. Integer results (gemm, quantize, dequant, add, absmax, rope) must match the native
kernels bit-exactly; the others within the named tolerances below (|native - ref| <= ATOL + RTOL * |ref|).
"""
from __future__ import annotations

import numpy as np

from quant.llama import apply_rope, rms_norm, silu
from quant.quantize import ACT_QMAX

# Float tolerances of the native kernels against these references (all ISAs):
RMSNORM_RTOL, RMSNORM_ATOL = 2e-6, 1e-6         # sum of squares in another order, x * (1/rms) vs x / rms
SILU_RTOL, SILU_ATOL = 4e-6, 1e-6               # polynomial exp (~2 ulp) in the SIMD variants
ATTENTION_RTOL, ATTENTION_ATOL = 1e-5, 5e-6     # dot products / softmax sums in another order, polynomial exp
ROPE_RTOL, ROPE_ATOL = 0.0, 0.0                 # exact: the same products and one add / sub, no fused multiply-add


def gemm_i8_i32(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """(M, K) int8 @ (N, K) int8 ^T -> (M, N) int32, exact (int64 accumulation, then int32: |sum| < 2^31)."""
    return (x.astype(np.int64) @ w.astype(np.int64).T).astype(np.int32)


def quantize_i8(x: np.ndarray, scale: float) -> np.ndarray:
    """int8 codes of fake_quant_act: clamp(rint(x / scale), ±127) with the division in float32; scale <= 0 -> 0."""
    if scale <= 0:
        return np.zeros(x.shape, dtype=np.int8)
    return np.clip(np.rint(x / np.float32(scale)), -ACT_QMAX, ACT_QMAX).astype(np.int8)


def dequant_i32(acc: np.ndarray, x_scale: float, w_scale: np.ndarray) -> np.ndarray:
    """(M, N) int32 -> float32 acc * (x_scale * w_scale[n]), the scale product rounded to float32 first."""
    s = np.float32(x_scale) * w_scale.astype(np.float32)                          # (N,)
    return acc.astype(np.float32) * s[None, :]


def linear_w8a8(x: np.ndarray, act_scale: float, w: np.ndarray, w_scale: np.ndarray) -> np.ndarray:
    """W8A8 linear (quant/export.py runtime): x (M, K) float32, w (N, K) int8, w_scale (N,) -> (M, N) float32."""
    return dequant_i32(gemm_i8_i32(quantize_i8(x, act_scale), w), act_scale, w_scale)


def rmsnorm(x: np.ndarray, g: np.ndarray, eps: float) -> np.ndarray:
    """(M, d) -> (M, d) float32."""
    return rms_norm(x, g, eps).astype(np.float32)


def rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Adjacent-pair rotation of x (T, H, hd) by cos / sin (T, hd/2); returns a new array (native: in place)."""
    return apply_rope(x, cos, sin)


def attention(q: np.ndarray, kcache: np.ndarray, vcache: np.ndarray, past: int) -> np.ndarray:
    """Causal GQA of m queries at positions past..past+m-1 over kcache / vcache (ctx_cap, KV, hd) -> (m, H*hd).
    Same math as quant/llama.py forward_logits (scale 1/sqrt(hd), max-subtracted softmax), in float64 and
    rounded once: the golden value the float32 kernels are compared with."""
    m, H, hd = q.shape
    KV = kcache.shape[1]
    L = past + m
    k = kcache[:L].astype(np.float64).transpose(1, 0, 2)                           # (KV, L, hd)
    v = vcache[:L].astype(np.float64).transpose(1, 0, 2)                           # (KV, L, hd)
    qh = q.astype(np.float64).transpose(1, 0, 2).reshape(KV, H // KV, m, hd)       # (KV, group, m, hd)
    att = np.einsum("kgmd,kld->kgml", qh, k) / np.sqrt(hd)                         # (KV, group, m, L)
    pos = past + np.arange(m)
    att[..., np.arange(L)[None, :] > pos[:, None]] = -np.inf                      # causal mask (m, L)
    att = np.exp(att - att.max(axis=-1, keepdims=True))
    att /= att.sum(axis=-1, keepdims=True)
    o = np.einsum("kgml,kld->mkgd", att, v)                                        # (m, KV, group, hd)
    return o.reshape(m, H * hd).astype(np.float32)


def silu_mul(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):                                              # exp(-g) -> inf: silu = -0
        return (silu(g) * u).astype(np.float32)


def add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a + b


def absmax(x: np.ndarray) -> float:
    return float(np.abs(x).max()) if x.size else 0.0
