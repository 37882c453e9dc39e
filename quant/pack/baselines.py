"""Baseline packed formats EdgeFlow is compared with (docs/packing.md): raw INT8, INT4/INT8 mixed, K-quant-like.
NumPy packers and NumPy reference unpackers; the C kernels in native/src/ef_baselines.c match them bit-exactly.

- int8: the int8 weights, C*D bytes.
- mixed ("pad each channel to 4 or 8 bits", the ablation's format): B <= 4 -> 4-bit codes u = q + 8, byte j =
  u[2j] | u[2j+1] << 4, ceil(D/2) bytes (last high nibble 0 for odd D); B >= 5 -> the D int8 bytes.
- kquant (llama.cpp K-quant style compact bit-split with per-group offsets): groups of 32 weights (last one padded),
  per group 1 byte int8 minimum m of the group's q, then v = q - m in [0, 2^B) in 4*B bytes:
  B >= 5 -> 16 bytes of low nibbles (byte j = v[j] & 15 | (v[j+16] & 15) << 4) then the B-4 high bits of each v as
  an LSB-first bitstream (4*(B-4) bytes, Q5_K's "qh" generalised); B <= 4 -> one B-bit LSB-first bitstream.
  Padding weights store v = 0. Lossless for the quantizer's ints: the per-group affine part is the minimum only
  (the integer codes already carry the channel scale), so it costs B + 0.25 bits per weight.
"""
from __future__ import annotations

import numpy as np

from quant.pack.layout import bits_array, channel_offsets, check_codes

KQ_GROUP = 32  # weights per K-quant-like group
_CHUNK = 512   # channels per vectorised batch (bounds temporary memory)


# ---- raw INT8 ----
def int8_pack(q: np.ndarray, bits, what: str = "tensor") -> np.ndarray:
    b = bits_array(bits, np.asarray(q).shape[0] if np.ndim(q) == 2 else -1, what)
    return check_codes(q, b, what).view(np.uint8).ravel().copy()


def int8_unpack_ref(payload: np.ndarray, bits, D: int) -> np.ndarray:
    C = np.asarray(bits).size
    return np.asarray(payload, dtype=np.uint8)[:C * D].view(np.int8).reshape(C, D).copy()


def int8_channel_nbytes(bits, D: int) -> np.ndarray:
    return np.full(np.asarray(bits).size, int(D), dtype=np.int64)


# ---- INT4/INT8 mixed ----
def mixed_channel_nbytes(bits, D: int) -> np.ndarray:
    b = np.asarray(bits, dtype=np.int64)
    return np.where(b <= 4, (int(D) + 1) // 2, int(D)).astype(np.int64)


def mixed_pack(q: np.ndarray, bits, what: str = "tensor") -> np.ndarray:
    b = bits_array(bits, np.asarray(q).shape[0] if np.ndim(q) == 2 else -1, what)
    q = check_codes(q, b, what)
    C, D = q.shape
    off = channel_offsets(mixed_channel_nbytes(b, D))
    out = np.zeros(int(off[-1]), dtype=np.uint8)
    lo = np.nonzero(b <= 4)[0]
    if lo.size:
        u = np.zeros((lo.size, D + (D & 1)), dtype=np.uint8)
        u[:, :D] = (q[lo].astype(np.int16) + 8).astype(np.uint8)
        nib = u[:, 0::2] | (u[:, 1::2] << 4)                                    # (n, ceil(D/2))
        for j, c in enumerate(lo):
            out[off[c]:off[c + 1]] = nib[j]
    for c in np.nonzero(b > 4)[0]:
        out[off[c]:off[c + 1]] = q[c].view(np.uint8)
    return out


def mixed_unpack_ref(payload: np.ndarray, bits, D: int) -> np.ndarray:
    b = np.asarray(bits, dtype=np.int64)
    off = channel_offsets(mixed_channel_nbytes(b, D))
    payload = np.asarray(payload, dtype=np.uint8)
    out = np.empty((b.size, int(D)), dtype=np.int8)
    for c in range(b.size):
        row = payload[off[c]:off[c + 1]]
        if b[c] <= 4:
            u = np.stack([row & 15, row >> 4], axis=1).ravel()[:D]
            out[c] = (u - np.uint8(8)).view(np.int8)
        else:
            out[c] = row.view(np.int8)
    return out


# ---- K-quant-like ----
def kquant_channel_nbytes(bits, D: int) -> np.ndarray:
    return (-(-int(D) // KQ_GROUP)) * (1 + 4 * np.asarray(bits, dtype=np.int64))


def _stream_pack(v: np.ndarray, nb: int) -> np.ndarray:
    """(..., 32) uint8 values < 2^nb -> (..., 4*nb) uint8 LSB-first bitstream."""
    bitsv = ((v[..., None] >> np.arange(nb, dtype=np.uint8)) & 1).astype(np.uint8)   # (..., 32, nb)
    return np.packbits(bitsv.reshape(*v.shape[:-1], KQ_GROUP * nb), axis=-1, bitorder="little")


def _stream_unpack(s: np.ndarray, nb: int) -> np.ndarray:
    """(..., 4*nb) bytes -> (..., 32) uint8."""
    flat = np.unpackbits(s, axis=-1, bitorder="little").reshape(*s.shape[:-1], KQ_GROUP, nb)
    return (flat.astype(np.uint16) << np.arange(nb, dtype=np.uint16)).sum(axis=-1).astype(np.uint8)


def kquant_pack(q: np.ndarray, bits, what: str = "tensor") -> np.ndarray:
    b = bits_array(bits, np.asarray(q).shape[0] if np.ndim(q) == 2 else -1, what)
    q = check_codes(q, b, what)
    C, D = q.shape
    off = channel_offsets(kquant_channel_nbytes(b, D))
    out = np.zeros(int(off[-1]), dtype=np.uint8)
    for B in np.unique(b):
        B = int(B)
        idx_all = np.nonzero(b == B)[0]
        for start in range(0, idx_all.size, _CHUNK):
            idx = idx_all[start:start + _CHUNK]
            _kquant_pack_rows(q[idx], B, idx, off, out)
    return out


def _kquant_pack_rows(qb: np.ndarray, B: int, idx: np.ndarray, off: np.ndarray, out: np.ndarray) -> None:
    """Pack channels idx (all B bits; qb = their ints (n, D)) into out at their offsets."""
    n, D = qb.shape
    G = -(-D // KQ_GROUP)
    qp = np.full((n, G * KQ_GROUP), 127, dtype=np.int16)
    qp[:, :D] = qb
    qp = qp.reshape(n, G, KQ_GROUP)                                          # (n, G, 32)
    m = qp.min(axis=2)                                                        # (n, G) group minimum
    v = (qp - m[..., None]).astype(np.int16)
    v.reshape(n, G * KQ_GROUP)[:, D:] = 0                                     # padding stores v = 0
    v = v.astype(np.uint8)
    if B >= 5:
        ql = (v[..., :16] & 15) | ((v[..., 16:] & 15) << 4)                  # (n, G, 16)
        body = np.concatenate([ql, _stream_pack(v >> 4, B - 4)], axis=2)
    else:
        body = _stream_pack(v, B)                                             # (n, G, 4B)
    rows = np.concatenate([m.astype(np.int8).view(np.uint8)[..., None], body], axis=2).reshape(n, -1)
    for j, c in enumerate(idx):
        out[off[c]:off[c + 1]] = rows[j]


def kquant_unpack_ref(payload: np.ndarray, bits, D: int) -> np.ndarray:
    b = np.asarray(bits, dtype=np.int64)
    G = -(-int(D) // KQ_GROUP)
    off = channel_offsets(kquant_channel_nbytes(b, D))
    payload = np.asarray(payload, dtype=np.uint8)
    out = np.empty((b.size, int(D)), dtype=np.int8)
    for B in np.unique(b):
        B = int(B)
        idx = np.nonzero(b == B)[0]
        rows = np.stack([payload[off[c]:off[c + 1]] for c in idx]).reshape(idx.size, G, 1 + 4 * B)
        m = rows[..., 0].view(np.int8).astype(np.int16)
        if B >= 5:
            ql = rows[..., 1:17]
            low = np.concatenate([ql & 15, ql >> 4], axis=2)
            v = low | (_stream_unpack(rows[..., 17:], B - 4) << 4)
        else:
            v = _stream_unpack(rows[..., 1:], B)
        qv = (v.astype(np.int16) + m[..., None]).reshape(idx.size, G * KQ_GROUP)[:, :D]
        out[idx] = qv.astype(np.int8)
    return out
