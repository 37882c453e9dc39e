"""Shared pieces of every packed format (docs/packing.md): the integer-code convention, the packed 3-bit width array.

Integer convention (fixed by quant/quantize.py): channel i of a (C, D) tensor has B_i bits in 1..8 and signed ints
q in [-(2^(B-1)), 2^(B-1)-1] (int8), plus a float32 scale. Packed formats store the offset-binary code
u = q + 2^(B-1) in [0, 2^B) (the INT4/INT8 mixed format uses u = q + 8 for its 4-bit channels); unpacking subtracts it
again modulo 256, so B = 8 works too. `check_codes` rejects anything outside the range, naming the channel.

Bit widths travel as a packed INT3 array (paper §4.2): code B-1 in 0..7, channel i at bits [3i, 3i+3), LSB-first,
ceil(3C/8) bytes.
"""
from __future__ import annotations

import numpy as np


class PackError(ValueError):
    """Bad input to a packer (one line, names the tensor/channel)."""


def bits_array(bits, C: int, what: str = "tensor") -> np.ndarray:
    """bits int or (C,) ints -> (C,) int64 checked to lie in 1..8."""
    b = np.asarray(bits)
    if b.ndim == 0:
        b = np.full(C, int(b), dtype=np.int64)
    if b.shape != (C,):
        raise PackError(f"{what}: bits must have shape ({C},) (got {b.shape})")
    if not np.issubdtype(b.dtype, np.integer):
        raise PackError(f"{what}: bits must be integers (got {b.dtype})")
    b = b.astype(np.int64)
    if C and (b.min() < 1 or b.max() > 8):
        i = int(np.nonzero((b < 1) | (b > 8))[0][0])
        raise PackError(f"{what}: channel {i} has bits={int(b[i])}, must be in 1..8")
    return b


def check_codes(q: np.ndarray, bits: np.ndarray, what: str = "tensor") -> np.ndarray:
    """q (C, D) integer -> int8 (C, D); every channel inside its signed B-bit range."""
    q = np.asarray(q)
    if q.ndim != 2:
        raise PackError(f"{what}: quantized ints must be 2-D (out_channels, in_channels), got shape {q.shape}")
    if not np.issubdtype(q.dtype, np.integer):
        raise PackError(f"{what}: quantized values must be integers (got {q.dtype})")
    if q.shape[0] != bits.shape[0]:
        raise PackError(f"{what}: {q.shape[0]} channels but {bits.shape[0]} bit widths")
    if q.size:
        lo = -(np.int64(1) << (bits - 1))
        hi = (np.int64(1) << (bits - 1)) - 1
        qmin, qmax = q.min(axis=1).astype(np.int64), q.max(axis=1).astype(np.int64)
        bad = np.nonzero((qmin < lo) | (qmax > hi))[0]
        if bad.size:
            i = int(bad[0])
            raise PackError(f"{what}: channel {i} has values in [{qmin[i]}, {qmax[i]}], outside "
                            f"[{lo[i]}, {hi[i]}] for {bits[i]} bits")
    return np.ascontiguousarray(q, dtype=np.int8)


def pack_bits3(bits: np.ndarray) -> np.ndarray:
    """(C,) ints in 1..8 -> (ceil(3C/8),) uint8."""
    codes = (np.asarray(bits, dtype=np.int64) - 1).astype(np.uint8)
    flat = ((codes[:, None] >> np.arange(3, dtype=np.uint8)) & 1).astype(np.uint8).ravel()  # (3C,)
    return np.packbits(flat, bitorder="little")


def unpack_bits3(b3: np.ndarray, C: int) -> np.ndarray:
    """(ceil(3C/8),) uint8 -> (C,) int8 bits in 1..8."""
    flat = np.unpackbits(np.asarray(b3, dtype=np.uint8), bitorder="little")[:3 * C].reshape(C, 3)
    return (flat.astype(np.int8) @ np.array([1, 2, 4], dtype=np.int8) + 1).astype(np.int8)


def bits3_nbytes(C: int) -> int:
    return (3 * C + 7) // 8


def channel_offsets(nbytes_per_channel: np.ndarray) -> np.ndarray:
    """(C,) bytes -> (C+1,) int64 start offsets (last = total)."""
    off = np.zeros(nbytes_per_channel.size + 1, dtype=np.int64)
    np.cumsum(nbytes_per_channel, out=off[1:])
    return off
