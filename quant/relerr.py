"""The relative-error (RE) metric of EdgeFlow §4.1 and appendix A: how much a B-bit quantization hurts one channel.

Owns: the exact metric RE(W_i, B) = 1 - cos(W_i, W_i^q) (used for validation and as an optional allocation metric)
and the closed form the allocator uses.

Closed form (appendix A): with E = W - W^q small and uncorrelated with W, 1 - cos ≈ E[E²] / (2·E[W²]); with the
uniform-rounding model E ~ U(-S/2, S/2), E[E²] = S²/12, and the symmetric per-channel scale S = max|W|/(2^(B-1) - 1):

    RE(W_i, B) = max|W_i|² / (24 · (2^(B-1) - 1)² · E[W_i²])        for B >= 2.

(The paper prints the constant as 1/2^(2B) · max²/E[W²]; ours keeps (2^(B-1)-1)² exactly — it is 4/2^(2B) up to the
"-1", which matters at low B. `tests/quant/test_relerr.py` compares it with the exact cosine distance on real rows.)

Conventions (all documented in docs/quantization.md):
- B = 1: the paper's scale is undefined (2^0 - 1 = 0). A 1-bit channel stores q = 0 for every weight, i.e. the channel
  dequantizes to zero; its RE is 1 (cosine distance to the zero vector, taken as 1). It costs 1 bit/weight on flash
  only because the packed format has no 0-bit width.
- The closed form can exceed 1 at B = 2 for heavy-tailed channels (crest factor max/rms > √24 ≈ 4.9), which a real
  quantizer never does (the max element always survives); we clamp it to 1. The allocator convexifies the curve
  (`quant.allocate`), so this non-monotonicity never breaks greedy optimality.
- An all-zero channel has RE = 0 at every B (nothing to lose); no division by zero.
"""
from __future__ import annotations

import numpy as np

from quant.quantize import dequantize_rows, quantize_rows

RE_ZERO_CHANNEL = 1.0   # RE of a non-zero channel quantized to all zeros (cosine distance to 0 defined as 1)


def _bits_array(bits, n: int | None = None) -> np.ndarray:
    b = np.asarray(bits, dtype=np.int64)
    if b.size and (b.min() < 1 or b.max() > 8):
        raise ValueError(f"bits must be in 1..8 (got {b.min()}..{b.max()})")
    return b


def qmax(bits) -> np.ndarray:
    """Largest code magnitude of the symmetric B-bit quantizer: 2^(B-1) - 1 (0 for B = 1)."""
    return (np.int64(1) << (np.asarray(bits, dtype=np.int64) - 1)) - 1


def re_closed_form(max_abs, mean_sq, bits) -> np.ndarray:
    """Closed-form RE, broadcast over channels and bit widths. max_abs, mean_sq: (C,) or broadcastable; bits: int(s)."""
    m = np.asarray(max_abs, dtype=np.float64)
    s = np.asarray(mean_sq, dtype=np.float64)
    b = _bits_array(bits)
    qm = qmax(b).astype(np.float64)
    num = m * m
    den = 24.0 * qm * qm * s
    with np.errstate(divide="ignore", invalid="ignore"):
        re = np.where(den > 0, num / np.where(den > 0, den, 1.0), RE_ZERO_CHANNEL)
    re = np.minimum(re, RE_ZERO_CHANNEL)
    return np.where(s > 0, re, 0.0)                              # all-zero channel: nothing to lose


def channel_stats(w_rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(max|w|, E[w²]) per row of w_rows (C, D), float64 (C,) each: the two statistics the closed form needs."""
    w = np.asarray(w_rows)
    w64 = w.astype(np.float64)
    return np.abs(w).max(axis=1).astype(np.float64), np.mean(w64 * w64, axis=1)   # max is exact in the input dtype


def re_exact(w_rows: np.ndarray, bits) -> np.ndarray:
    """Exact RE = 1 - cos(W_i, dequant(quant(W_i, B))) per row. w_rows (C, D); bits int or (C,) -> (C,) float64."""
    w = np.asarray(w_rows, dtype=np.float32)
    q, scale = quantize_rows(w, bits)
    wq = dequantize_rows(q, scale).astype(np.float64)
    w64 = w.astype(np.float64)
    dot = np.einsum("cd,cd->c", w64, wq)
    nw = np.sqrt(np.einsum("cd,cd->c", w64, w64))
    nq = np.sqrt(np.einsum("cd,cd->c", wq, wq))
    with np.errstate(divide="ignore", invalid="ignore"):
        cos = np.where(nq > 0, dot / np.where(nq * nw > 0, nq * nw, 1.0), 1.0 - RE_ZERO_CHANNEL)
    re = 1.0 - cos
    return np.where(nw > 0, np.clip(re, 0.0, 2.0), 0.0)


def re_table(max_abs, mean_sq, min_bits: int = 1, max_bits: int = 8) -> np.ndarray:
    """Closed-form RE for every channel and every bit width min_bits..max_bits -> (C, max_bits - min_bits + 1)."""
    b = np.arange(min_bits, max_bits + 1)
    return re_closed_form(np.asarray(max_abs)[:, None], np.asarray(mean_sq)[:, None], b[None, :])


def re_exact_table(w_rows: np.ndarray, min_bits: int = 1, max_bits: int = 8) -> np.ndarray:
    """Exact RE for every row and bit width -> (C, max_bits - min_bits + 1)."""
    return np.stack([re_exact(w_rows, b) for b in range(min_bits, max_bits + 1)], axis=1)
