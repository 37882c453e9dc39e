"""Symmetric uniform per-output-channel weight quantizer and static per-tensor INT8 activation quantizer (EdgeFlow §4.1;
docs/quantization.md).

Integer convention (the packed file format relies on it): a channel i with B_i bits stores signed integers q with
|q| <= 2^(B_i-1) - 1 (a subset of the two's-complement range [-2^(B-1), 2^(B-1)-1]; the code -2^(B-1) is never produced)
and one float32 scale S_i = max|W_i| / (2^(B_i-1) - 1); W_i ≈ q · S_i.
B = 1: 2^0 - 1 = 0, so the channel stores q = 0 and S_i = 0 (the channel dequantizes to zero; RE = 1, see quant.relerr).
An all-zero channel stores q = 0, S_i = 0 at any B (no division by zero).
Rounding: round-half-to-even (`np.rint`), the same as the C packer/unpacker cross-tests expect.
"""
from __future__ import annotations

import numpy as np

ACT_BITS = 8                        # NPU constraint: static per-tensor symmetric INT8 activations (EdgeFlow §3.2)
ACT_QMAX = 2 ** (ACT_BITS - 1) - 1  # 127


def quantize_rows(w: np.ndarray, bits) -> tuple[np.ndarray, np.ndarray]:
    """w (C, D) float; bits int or (C,) ints in 1..8 -> (q int8 (C, D), scale float32 (C,))."""
    w = np.asarray(w, dtype=np.float32)
    if w.ndim != 2:
        raise ValueError(f"quantize_rows expects a 2-D (out_channels, in_channels) array, got shape {w.shape}")
    b = np.broadcast_to(np.asarray(bits, dtype=np.int64), (w.shape[0],))
    if b.size and (b.min() < 1 or b.max() > 8):
        raise ValueError(f"bits must be in 1..8 (got {b.min()}..{b.max()})")
    qm = ((np.int64(1) << (b - 1)) - 1).astype(np.float32)              # (C,) 2^(B-1)-1
    max_abs = np.abs(w).max(axis=1) if w.shape[1] else np.zeros(w.shape[0], np.float32)
    scale = np.zeros(w.shape[0], dtype=np.float32)
    ok = (qm > 0) & (max_abs > 0)
    scale[ok] = max_abs[ok] / qm[ok]
    inv = np.zeros_like(scale)
    inv[ok] = 1.0 / scale[ok]
    q = np.rint(w * inv[:, None])
    np.minimum(q, qm[:, None], out=q)                                   # = np.clip(q, -qm, qm), 3x faster here
    np.maximum(q, -qm[:, None], out=q)
    q = q.astype(np.int8)
    return q, scale


def dequantize_rows(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """q (C, D) int, scale (C,) -> float32 (C, D)."""
    return q.astype(np.float32) * np.asarray(scale, dtype=np.float32)[:, None]


def fake_quant_rows(w: np.ndarray, bits) -> np.ndarray:
    """Quantize-dequantize round trip, float32 (C, D)."""
    return dequantize_rows(*quantize_rows(w, bits))


def act_scale(max_abs: float) -> float:
    """Static per-tensor INT8 scale from a calibrated max |activation| (0 -> 0: the tensor is all zeros)."""
    return float(max_abs) / ACT_QMAX if max_abs > 0 else 0.0


def fake_quant_act(x: np.ndarray, scale: float) -> np.ndarray:
    """Static per-tensor symmetric INT8 round trip; values beyond the calibrated range saturate at ±127."""
    if scale <= 0:
        return np.zeros_like(x)
    return (np.clip(np.rint(x / scale), -ACT_QMAX, ACT_QMAX) * scale).astype(np.float32)
