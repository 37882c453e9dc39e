"""The EdgeFlow SIMD-friendly weightlet format: NumPy packer and NumPy reference unpacker (EdgeFlow §4.2,
Fig. 7 and 8; docs/packing.md). The C kernels in native/src/ef_unpack.c must reproduce `unpack_ref` bit-exactly.

Layout of one channel of D weights at B bits, register width R bits (128 by default; 256/512 for AVX2/AVX-512):
  - codes u = q + 2^(B-1) in [0, 2^B) (quant/pack/layout.py); D is cut into floor(D/R) groups of R weights and, if
    rem = D mod R > 0, one short tail group of R_t = 8*ceil(rem/8) weights (zero-padded, same layout with stripes of
    R_t/8 weights). So a channel takes B*ceil(D/8) bytes, whatever R is (D = 576 at R = 128: 4 groups + R_t = 64).
  - B splits into weightlets: B = 8 -> one 8-bit piece (plain bytes); otherwise the binary digits of B, widest first
    (7 -> 4+2+1, 6 -> 4+2, 5 -> 4+1, 3 -> 2+1). The first piece holds the lowest bits of u.
  - A group = 8 stripes of S = R/8 consecutive weights. A piece of width w fills w blocks of S bytes (R bits, one
    register load). Block k holds stripes k*(8/w) + t, t < 8/w, stripe t in bits [8-w(t+1), 8-wt) of each byte
    (stripe 0 in the top bits; byte j of a 1-bit block = weights j, j+S, ..., j+7S, MSB first, as in Fig. 7).
  - group bytes = blocks of piece 0, then piece 1, ...: B*S bytes; groups follow each other, channels too.
Unpacking one stripe: per piece, shift its block so the stripe's bits land at the piece's offset, mask, OR, then
subtract 2^(B-1) (Fig. 8: mask, align, merge).
"""
from __future__ import annotations

import numpy as np

from quant.pack.layout import bits_array, channel_offsets, check_codes

GROUPS = (128, 256, 512)  # supported register widths R, bits
DEFAULT_GROUP = 128
_CHUNK = 2048  # channels per vectorised batch (bounds temporary memory)


def pieces(B: int) -> list[tuple[int, int]]:
    """[(width, bit offset in u), ...] of the weightlets of a B-bit weight, widest first."""
    if B == 8:
        return [(8, 0)]
    out, off = [], 0
    for w in (4, 2, 1):
        if B & w:
            out.append((w, off))
            off += w
    return out


def check_group(R: int) -> int:
    if int(R) not in GROUPS:
        raise ValueError(f"weightlet group size must be one of {GROUPS} bits (got {R})")
    return int(R)


def channel_nbytes(bits, D: int, R: int = DEFAULT_GROUP) -> np.ndarray:
    """(C,) bytes each channel occupies: B * ceil(D/8) (full groups + short tail group)."""
    check_group(R)
    return -(-int(D) // 8) * np.asarray(bits, dtype=np.int64)


def _split(D: int, R: int) -> list[tuple[int, int, int]]:
    """[(first weight, n groups, group size), ...]: the full groups, then the short tail group if any."""
    full, rem = divmod(int(D), R)
    out = [(0, full, R)] if full else []
    if rem:
        out.append((full * R, 1, -(-rem // 8) * 8))
    return out


def _pack_groups(u: np.ndarray, B: int) -> np.ndarray:
    """u (n, G, 8, S) codes -> (n, G, B*S) packed group bytes."""
    n, G, _, S = u.shape
    parts = []
    for w, o in pieces(B):
        per = 8 // w
        f = ((u >> o) & ((1 << w) - 1)).reshape(n, G, w, per, S)                 # (n, G, block, t, byte)
        sh = (8 - w * (np.arange(per) + 1)).astype(np.uint8)[None, None, None, :, None]
        parts.append(np.bitwise_or.reduce(f << sh, axis=3).reshape(n, G, w * S))
    return np.concatenate(parts, axis=2)


def _unpack_groups(rows: np.ndarray, B: int) -> np.ndarray:
    """(n, G, B*S) packed group bytes -> u (n, G, 8, S) codes."""
    n, G, BS = rows.shape
    S = BS // B
    u = np.zeros((n, G, 8, S), dtype=np.uint8)
    pos = 0
    for w, o in pieces(B):
        per = 8 // w
        blk = rows[:, :, pos * S:(pos + w) * S].reshape(n, G, w, 1, S)           # (n, G, block, 1, byte)
        pos += w
        sh = (8 - w * (np.arange(per) + 1)).astype(np.uint8)[None, None, None, :, None]
        f = (blk >> sh) & ((1 << w) - 1)                                          # (n, G, block, t, byte)
        u |= (f.reshape(n, G, 8, S) << o).astype(np.uint8)
    return u


def pack(q: np.ndarray, bits, R: int = DEFAULT_GROUP, what: str = "tensor") -> np.ndarray:
    """q int (C, D), bits (C,) -> payload uint8 (sum of channel_nbytes,)."""
    R = check_group(R)
    b = bits_array(bits, np.asarray(q).shape[0] if np.ndim(q) == 2 else -1, what)
    q = check_codes(q, b, what)
    C, D = q.shape
    off = channel_offsets(channel_nbytes(b, D, R))
    payload = np.zeros(int(off[-1]), dtype=np.uint8)
    for B in np.unique(b):
        B = int(B)
        idx_all = np.nonzero(b == B)[0]
        for c in range(0, idx_all.size, _CHUNK):
            idx = idx_all[c:c + _CHUNK]
            n = idx.size
            u = (q[idx].astype(np.int16) + (1 << (B - 1))).astype(np.uint8)      # (n, D) codes
            rows = []
            for start, G, Rg in _split(D, R):
                ug = np.zeros((n, G * Rg), dtype=np.uint8)                        # zero-padded tail
                seg = u[:, start:start + G * Rg]
                ug[:, :seg.shape[1]] = seg
                rows.append(_pack_groups(ug.reshape(n, G, 8, Rg // 8), B).reshape(n, -1))
            rows = np.concatenate(rows, axis=1) if rows else np.zeros((n, 0), np.uint8)  # (n, channel bytes)
            starts = off[idx]
            if n and np.all(np.diff(idx) == 1):                                  # consecutive channels: one slice
                payload[starts[0]:starts[0] + rows.size] = rows.ravel()
            else:
                for j in range(n):
                    payload[starts[j]:starts[j] + rows.shape[1]] = rows[j]
    return payload


def unpack_ref(payload: np.ndarray, bits, D: int, R: int = DEFAULT_GROUP) -> np.ndarray:
    """NumPy reference: payload uint8, bits (C,) -> q int8 (C, D). Golden output for the C kernels."""
    R = check_group(R)
    b = np.asarray(bits, dtype=np.int64)
    C, D = b.size, int(D)
    off = channel_offsets(channel_nbytes(b, D, R))
    payload = np.asarray(payload, dtype=np.uint8)
    if payload.size < off[-1]:
        raise ValueError(f"weightlet payload has {payload.size} bytes, the layout needs {int(off[-1])}")
    out = np.empty((C, D), dtype=np.int8)
    for B in np.unique(b):
        B = int(B)
        idx = np.nonzero(b == B)[0]
        n, nb = idx.size, int(channel_nbytes([B], D, R)[0])
        rows = np.stack([payload[off[i]:off[i] + nb] for i in idx])               # (n, channel bytes)
        u = np.zeros((n, D), dtype=np.uint8)
        at = 0
        for start, G, Rg in _split(D, R):
            gb = G * B * Rg // 8
            ug = _unpack_groups(rows[:, at:at + gb].reshape(n, G, B * Rg // 8), B).reshape(n, G * Rg)
            at += gb
            u[:, start:start + G * Rg] = ug[:, :D - start]
        out[idx] = (u - np.uint8(1 << (B - 1))).view(np.int8)
    return out
