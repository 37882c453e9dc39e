"""llama.cpp's block weight formats Q8_0 and Q4_K as NumPy quantize → dequantize round trips, used to measure what the
precisions of the Voltron paper's devices (llama.cpp, Voltron §4.3 mixed precision; `planner/voltron/devices.py`) cost
in accuracy (`quant.measure_importance`).

- Q8_0 (ggml `quantize_row_q8_0_ref`, ggml/src/ggml-quants.c): blocks of 32 weights along a row, one fp16 scale
  d = max|x|/127, q = roundf(x/d) (round half away from zero). gguf-py's `gguf.quants.Q8_0` implements it bit-exactly
  (its docstring says so); we call it.
- Q4_K (ggml `quantize_row_q4_K_ref`, the quantizer llama.cpp uses for Q4_K without an importance matrix): super-blocks
  of 256 weights = 8 sub-blocks of 32; each sub-block gets a scale and a min from `make_qkx2_quants` (weighted
  least-squares search over 21 candidate scales, weights av_x + |x|), quantized to 6 bits relative to the super-block's
  fp16 `d` / `dmin`; 4-bit codes l = nearest_int((x + dmin·m)/(d·sc)) clipped to 0..15; x ≈ d·sc·l − dmin·m.
  gguf-py only dequantizes Q4_K, so `quantize_q4_k` is a NumPy port of the C reference: float32 arithmetic, the C
  loops' sequential accumulation order, nearest_int = round half to even (`np.rint`). Its blocks are packed in ggml's
  144-byte `block_q4_K` layout, so gguf-py's `dequantize` reads them (tests/quant/test_ggml_blocks.py checks that, and
  bit-exact equality with ggml's own `quantize_row_q4_K_ref` when llama-cpp-python's libggml is installed).

- Q8_K (ggml `quantize_row_q8_K_ref`): what llama.cpp quantizes the *activations* to for a dot product with Q4_K
  weights — blocks of 256, scale d = max/−127 from the signed value of largest magnitude, q = nearest_int(x/d) capped
  at 127; `q8_k_roundtrip`. (For Q8_0 weights the activations go to Q8_0: `q8_0_roundtrip` of the input rows.)

Rows whose length is not a multiple of 256 (SmolLM2's d_model = 576) are zero-padded to one for Q4_K: the padding
sub-blocks get scale = min = 0 and do not change the super-block's d / dmin, so every real sub-block is quantized by the
reference algorithm (llama.cpp itself would store such a tensor as Q5_0 — its fallback for Q4_K — but the modelled
devices' models, hidden sizes 2048..5120, are multiples of 256 and run true Q4_K).

`shift`: the block grid can be offset by `shift` columns (a cyclic roll of the input dimension before quantizing,
undone after). The reference SmolLM2 weights are the shipped GGUF's Q4_1 weights (32-blocks along the input
dimension); re-quantizing them with blocks on the same grid partly reproduces that grid and understates the error a
format has on the original weights. A half-block shift (16) puts two different Q4_1 blocks into every 32-block.
"""
from __future__ import annotations

import numpy as np

QK8_0 = 32             # weights per Q8_0 block
QK_K = 256             # weights per K-quant super-block
SUB = 32               # weights per Q4_K sub-block
Q4_K_BYTES = 144       # sizeof(block_q4_K): d, dmin (fp16), scales[12], qs[128]


def _rolled(w: np.ndarray, shift: int, block: int) -> np.ndarray:
    w = np.asarray(w, dtype=np.float32)
    if w.ndim != 2:
        raise ValueError(f"expects a 2-D (out_channels, in_channels) weight, got shape {w.shape}")
    if not 0 <= shift < block:
        raise ValueError(f"shift must be in 0..{block - 1} (got {shift})")
    return np.roll(w, -shift, axis=1) if shift else w


# ---- Q8_0 -------------------------------------------------------------------------------------------------------

def q8_0_roundtrip(w: np.ndarray, shift: int = 0) -> np.ndarray:
    """(C, D) float32, D a multiple of 32 -> Q8_0 quantized and dequantized (C, D) float32 (gguf-py, bit-exact)."""
    import gguf

    x = _rolled(w, shift, QK8_0)
    if x.shape[1] % QK8_0:
        raise ValueError(f"Q8_0 needs rows of a multiple of {QK8_0} values (got {x.shape[1]})")
    t = gguf.GGMLQuantizationType.Q8_0
    y = gguf.quants.dequantize(gguf.quants.quantize(np.ascontiguousarray(x), t), t).reshape(x.shape)
    return np.roll(y, shift, axis=1) if shift else y


# ---- Q4_K: port of ggml's make_qkx2_quants + quantize_row_q4_K_ref ------------------------------------------------

def _seq_sum(terms) -> np.ndarray:
    """Sequential float32 sum over the 32 positions (the C loop order), terms yielding (N,) arrays."""
    acc = None
    for t in terms:
        acc = t.astype(np.float32) if acc is None else (acc + t).astype(np.float32)
    return acc


def _make_qkx2(x: np.ndarray, wt: np.ndarray, nmax: int = 15, rmin: float = -1.0, rdelta: float = 0.1,
               nstep: int = 20) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ggml make_qkx2_quants(32, 15, x, weights, L, &the_min, Laux, -1, 0.1, 20, false) on N sub-blocks at once.

    x, wt (N, 32) float32 -> (scale (N,), the_min (N,) = −min ≥ 0, L (N, 32) uint8)."""
    f32 = np.float32
    n = x.shape[1]
    mn, mx = x[:, 0].copy(), x[:, 0].copy()
    sum_w, sum_x = wt[:, 0].copy(), (wt[:, 0] * x[:, 0]).astype(f32)
    for i in range(1, n):
        mn, mx = np.minimum(mn, x[:, i]), np.maximum(mx, x[:, i])
        sum_w = (sum_w + wt[:, i]).astype(f32)
        sum_x = (sum_x + (wt[:, i] * x[:, i]).astype(f32)).astype(f32)
    mn = np.where(mn > 0, f32(0), mn).astype(f32)
    flat = mx == mn                                                        # all equal → L = 0, scale 0
    rng = np.where(flat, f32(1), mx - mn).astype(f32)
    xm = (x - mn[:, None]).astype(f32)                                     # (N, 32) x − min
    iscale = (f32(nmax) / rng).astype(f32)
    scale = (f32(1) / iscale).astype(f32)
    L = np.clip(np.rint(iscale[:, None] * xm), 0, nmax).astype(f32)       # (N, 32)

    def err(s, m, lv):                                                     # Σ w·(s·l + m − x)², C order
        return _seq_sum(wt[:, i] * np.square((s * lv[:, i] + m - x[:, i]).astype(f32)) for i in range(n))

    best = err(scale, mn, L)
    for k in range(nstep + 1):
        # as in C, a better candidate's min replaces `min` for the following candidates' max − min and x − min
        rng = np.where(flat, f32(1), mx - mn).astype(f32)
        xm = (x - mn[:, None]).astype(f32)
        isc = ((f32(rmin) + f32(rdelta) * f32(k) + f32(nmax)) / rng).astype(f32)
        La = np.clip(np.rint(isc[:, None] * xm), 0, nmax).astype(f32)
        sum_l = _seq_sum(wt[:, i] * La[:, i] for i in range(n))
        sum_l2 = _seq_sum((wt[:, i] * La[:, i]).astype(f32) * La[:, i] for i in range(n))
        sum_xl = _seq_sum(((wt[:, i] * La[:, i]).astype(f32) * x[:, i]).astype(f32) for i in range(n))
        D = (sum_w * sum_l2 - sum_l * sum_l).astype(f32)
        ok = D > 0
        Ds = np.where(ok, D, f32(1))
        with np.errstate(divide="ignore", invalid="ignore"):
            ts = ((sum_w * sum_xl - sum_x * sum_l) / Ds).astype(f32)
            tm = ((sum_l2 * sum_x - sum_l * sum_xl) / Ds).astype(f32)
            pos = tm > 0
            ts = np.where(pos, (sum_xl / np.where(sum_l2 > 0, sum_l2, f32(1))).astype(f32), ts)
        tm = np.where(pos, f32(0), tm)
        cur = err(ts, tm, La)
        take = ok & (cur < best)
        L[take], best[take], scale[take], mn[take] = La[take], cur[take], ts[take], tm[take]
    scale[flat] = 0.0
    L[flat] = 0.0
    return scale.astype(f32), (-mn).astype(f32), L.astype(np.uint8)


def _pack_scales(ls: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """6-bit scales / mins (nb, 8) -> ggml's 12-byte packing (nb, 12) uint8 (get_scale_min_k4 inverts it)."""
    s = np.zeros((ls.shape[0], 12), dtype=np.uint8)
    s[:, 0:4], s[:, 4:8] = ls[:, :4], lm[:, :4]
    s[:, 8:12] = (ls[:, 4:] & 0xF) | ((lm[:, 4:] & 0xF) << 4)
    s[:, 0:4] |= (ls[:, 4:] >> 4) << 6
    s[:, 4:8] |= (lm[:, 4:] >> 4) << 6
    return s


def _unpack_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(nb, 12) uint8 -> (sc, m) (nb, 8) uint8 — ggml get_scale_min_k4."""
    sc = np.concatenate([s[:, 0:4] & 63, (s[:, 8:12] & 0xF) | ((s[:, 0:4] >> 6) << 4)], axis=1)
    m = np.concatenate([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], axis=1)
    return sc, m


def quantize_q4_k(x: np.ndarray) -> np.ndarray:
    """Flat float32 values (n,), n a multiple of 256 -> ggml block_q4_K bytes (n/256, 144) uint8
    (quantize_row_q4_K_ref)."""
    f32 = np.float32
    x = np.ascontiguousarray(x, dtype=f32).reshape(-1)
    if x.size % QK_K:
        raise ValueError(f"Q4_K needs a multiple of {QK_K} values (got {x.size})")
    nb = x.size // QK_K
    xs = x.reshape(nb * 8, SUB)                                            # (nb*8, 32) sub-blocks
    sum_x2 = _seq_sum((xs[:, i] * xs[:, i]).astype(f32) for i in range(SUB))
    av_x = np.sqrt((sum_x2 / f32(SUB)).astype(f32)).astype(f32)
    wt = (av_x[:, None] + np.abs(xs)).astype(f32)
    scales, mins, L = _make_qkx2(xs, wt)
    scales, mins = scales.reshape(nb, 8), mins.reshape(nb, 8)
    max_scale = np.maximum(scales.max(axis=1), f32(0))                     # (nb,) C: starts at 0, keeps the larger
    max_min = np.maximum(mins.max(axis=1), f32(0))
    with np.errstate(divide="ignore"):
        inv_scale = np.where(max_scale > 0, f32(63) / max_scale, f32(0)).astype(f32)
        inv_min = np.where(max_min > 0, f32(63) / max_min, f32(0)).astype(f32)
    ls = np.minimum(63, np.rint(inv_scale[:, None] * scales).astype(np.int64)).astype(np.uint8)   # (nb, 8)
    lm = np.minimum(63, np.rint(inv_min[:, None] * mins).astype(np.int64)).astype(np.uint8)
    d16 = (max_scale / f32(63)).astype(np.float16)                        # GGML_FP32_TO_FP16
    dmin16 = (max_min / f32(63)).astype(np.float16)
    d = (d16.astype(f32)[:, None] * ls.astype(f32)).reshape(-1)           # (nb*8,) sub-block step
    dm = (dmin16.astype(f32)[:, None] * lm.astype(f32)).reshape(-1)       # (nb*8,) sub-block offset
    nz = d != 0                                                            # C: `if (!d) continue;` keeps L
    with np.errstate(divide="ignore", invalid="ignore"):
        l2 = np.clip(np.rint(((xs + dm[:, None]).astype(f32) / np.where(nz, d, f32(1))[:, None]).astype(f32)), 0, 15)
    L = np.where(nz[:, None], l2.astype(np.uint8), L).reshape(nb, QK_K)
    q = L.reshape(nb, 4, 2, 32)                                            # 64-value groups: low / high nibbles
    qs = (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(nb, 128).astype(np.uint8)
    return np.concatenate([d16.view(np.uint8).reshape(nb, 2), dmin16.view(np.uint8).reshape(nb, 2),
                           _pack_scales(ls, lm), qs], axis=1)


def dequantize_q4_k(blocks: np.ndarray) -> np.ndarray:
    """ggml block_q4_K bytes (nb, 144) -> float32 (nb*256,) (dequantize_row_q4_K; our own, to cross-check gguf-py)."""
    b = np.asarray(blocks, dtype=np.uint8).reshape(-1, Q4_K_BYTES)
    nb = b.shape[0]
    d = b[:, 0:2].copy().view(np.float16).astype(np.float32)              # (nb, 1)
    dmin = b[:, 2:4].copy().view(np.float16).astype(np.float32)
    sc, m = _unpack_scales(b[:, 4:16])
    qs = b[:, 16:].reshape(nb, 4, 1, 32)
    lv = np.concatenate([qs & 0xF, qs >> 4], axis=2).reshape(nb, 8, 32).astype(np.float32)   # (nb, 8, 32)
    return ((d * sc)[:, :, None] * lv - (dmin * m)[:, :, None]).astype(np.float32).reshape(-1)


def q4_k_roundtrip(w: np.ndarray, shift: int = 0) -> np.ndarray:
    """(C, D) float32 -> Q4_K quantized and dequantized (C, D) float32; rows zero-padded to a multiple of 256."""
    x = _rolled(w, shift, SUB)
    C, D = x.shape
    Dp = -(-D // QK_K) * QK_K
    xp = np.zeros((C, Dp), dtype=np.float32)
    xp[:, :D] = x
    y = dequantize_q4_k(quantize_q4_k(xp)).reshape(C, Dp)[:, :D]
    return np.roll(y, shift, axis=1) if shift else y


# ---- Q8_K: the activation blocks of a Q4_K dot product -----------------------------------------------------------

def q8_k_roundtrip(x: np.ndarray, shift: int = 0) -> np.ndarray:
    """(T, D) float32 -> Q8_K (ggml quantize_row_q8_K_ref) quantized and dequantized (T, D) float32; rows zero-padded
    to a multiple of 256 (zeros change no block's max)."""
    f32 = np.float32
    v = _rolled(x, shift, SUB)
    T, D = v.shape
    Dp = -(-D // QK_K) * QK_K
    b = np.zeros((T, Dp), dtype=f32)
    b[:, :D] = v
    b = b.reshape(-1, QK_K)                                                # (nb, 256)
    mx = np.take_along_axis(b, np.abs(b).argmax(axis=1)[:, None], axis=1)[:, 0]   # first value of largest |x|
    ok = mx != 0
    with np.errstate(divide="ignore"):
        iscale = np.where(ok, f32(-127) / np.where(ok, mx, f32(1)), f32(0)).astype(f32)
        d = np.where(ok, (f32(1) / np.where(ok, iscale, f32(1))).astype(f32), f32(0))
    q = np.minimum(127, np.rint((iscale[:, None] * b).astype(f32)))       # (nb, 256) int8 codes
    y = (d[:, None] * q).astype(f32).reshape(T, Dp)[:, :D]
    return np.roll(y, shift, axis=1) if shift else y
