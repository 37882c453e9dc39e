"""Weight formats on flash for the cold-start planner: per-channel bit allocations -> bytes read and unpack work.

EdgeFlow §3.2 / §4.2; docs/packing.md. Bytes on flash of one (C out, D in) tensor whose channel c has B_c bits come from
the packing format's owner, `quant.pack.packed_nbytes` (the tensor blob exactly as the container writes it: 3-bit
widths, float32 scales, payload): `int8`, `mixed` (INT4/INT8, channels padded to 4 or 8 bits), `weightlet` (EdgeFlow's
SIMD-friendly format) and `kquant` (compact bit-split with per-group minimums). Unpack work (`unpack_work`):
- `weightlet`: per stripe of 16 weights, 3 SIMD instructions (mask, shift, or; Fig. 8) per weightlet block + a fixed 2
  (offset to INT8, store). With the Fig. 4a allocation this is 0.48 instructions per weight, the paper's figure.
- `mixed`: only the INT4 channels are expanded; `kquant`: device `kquant_unpack_cycles_per_weight` (scalar-heavy,
  fitted to Fig. 4b); `int8`: nothing.
- `ggml`: llama.cpp's own block types (bits per weight from ggml's block layouts), per tensor as llama.cpp's quantizer
  writes a file type (`ggml_tensor_types`), and the types ggml-cpu repacks at load on x86 (`GGML_REPACK_X86`).

Bit allocations come from the quantizer's statistical twin (`quant.twin.twin_bits`) for models without weights here
and from the quantizer on the real weights otherwise; a uniform allocation at the budget (floor/ceil mix with the
exact mean) is used only when asked for (`bits_source=uniform`), never as a silent fallback, and the metrics say which
one was used (`bits_source`). Cached allocations are keyed by a hash of the allocator's (and twin's) source code.
"""
from __future__ import annotations

import hashlib
import io
import math
from pathlib import Path

import numpy as np

from quant.arch import ModelSpec
from quant.atomic import atomic_write_bytes
from quant.pack import packed_nbytes

FORMATS = ("int8", "mixed", "weightlet", "kquant")
STRIPE = 16                # weights per stripe (R/8 with R = 128-bit NEON registers)
INSTR_PER_BLOCK_STRIPE = 3  # mask, shift, or (Fig. 8)
INSTR_FIXED_PER_STRIPE = 2  # offset/sign-extend to INT8 + store; fitted so the Fig. 4a allocation gives 0.48 instr/w

# llama.cpp block formats: bits per weight including block scales (ggml-common.h: block bytes x 8 / 32 weights for
# Q4_0 and IQ4_NL 18 B, Q4_1 20 B, Q5_0 22 B, Q5_1 24 B, Q8_0 34 B; / 256 weights for the K-quants).
GGML_BPW = {"Q2_K": 2.625, "Q3_K": 3.4375, "Q4_K": 4.5, "Q5_K": 5.5, "Q6_K": 6.5625, "Q8_0": 8.5,
            "Q4_0": 4.5, "Q4_1": 5.0, "Q5_0": 5.5, "Q5_1": 6.0, "IQ4_NL": 4.5}
# llama.cpp file types (`llama_model_quantize` ftype): a file type names one tensor type per linear weight, or a mix
# (Q4_K_M); `ggml_tensor_types` gives the per-tensor types llama.cpp writes for it.
GGML_FTYPES = (*GGML_BPW, "Q4_K_M", "Q5_K_M")
QK_K = 256                 # weights per K-quant super-block: a row of another length cannot hold a K-quant
# llama.cpp's fallback for a tensor whose row length is not a multiple of QK_K (llama-quant.cpp, tensor_type
# fallback): the K-quant becomes the legacy block type of about the same size.
K_FALLBACK = {"Q2_K": "IQ4_NL", "Q3_K": "IQ4_NL", "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}
# ggml-cpu's repacking on x86 with AVX2 / AVX-512 (ggml-cpu/repack.cpp, ggml_repack_get_optimal_repack_type, the
# version llama-cpp-python 0.3.16 vendors): these tensor types are re-laid out at load into interleaved 8x8 blocks
# (the CPU_REPACK buffer: llama.cpp's log names q4_0_8x8 and q4_K_8x8 on this host) when their row count is a
# multiple of 8; Q8_0, Q5_0, Q6_K stay as read. The token embedding (a row gather, not a matmul) is never repacked.
GGML_REPACK_X86 = {"Q4_0": "q4_0_8x8", "Q4_K": "q4_K_8x8"}


def ggml_type_for_budget(bits: float) -> str:
    """llama.cpp type closest to (not below) an average bit budget: 4 -> Q4_K, 5 -> Q5_K, 6 -> Q6_K, 7-8 -> Q8_0."""
    if bits >= 7:
        return "Q8_0"
    for name, nominal in (("Q2_K", 2), ("Q3_K", 3), ("Q4_K", 4), ("Q5_K", 5), ("Q6_K", 6)):
        if bits <= nominal:
            return name
    return "Q8_0"


def _use_more_bits(i: int, n: int) -> bool:
    """llama-quant.cpp's use_more_bits: the first and last eighth of the layers and every third one between."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _fit_row(gtype: str, d_in: int) -> str:
    return K_FALLBACK.get(gtype, gtype) if gtype.endswith("_K") and d_in % QK_K else gtype


def ggml_tensor_types(spec: ModelSpec, ftype: str) -> dict[str, list[str]]:
    """Per linear tensor kind (`spec.linear_shapes()`): the ggml type of each layer's tensor in a llama.cpp file of
    type `ftype`, plus "output" (the LM head; the token embedding when tied) as a one-entry list. From
    llama-quant.cpp's llama_tensor_get_type: the output takes Q6_K unless the file is Q8_0; Q4_K_M / Q5_K_M give
    attn_v and ffn_down Q6_K in the layers `_use_more_bits` picks, the file's K-quant elsewhere; a K-quant tensor
    whose rows are not a multiple of QK_K takes K_FALLBACK's type (SmolLM2's 576-wide rows)."""
    if ftype not in GGML_FTYPES:
        raise ValueError(f"ftype must be one of {', '.join(GGML_FTYPES)} (got {ftype!r})")
    base = {"Q4_K_M": "Q4_K", "Q5_K_M": "Q5_K"}.get(ftype, ftype)
    out: dict[str, list[str]] = {}
    n = spec.n_layers
    for kind, (_c, d) in spec.linear_shapes().items():
        types = []
        for i in range(n):
            t = base
            if ftype in ("Q4_K_M", "Q5_K_M") and kind in ("attn_v", "ffn_down") and _use_more_bits(i, n):
                t = "Q6_K"
            types.append(_fit_row(t, d))
        out[kind] = types
    out["output"] = [_fit_row("Q8_0" if ftype == "Q8_0" else "Q6_K", spec.d_model)]
    return out


def ggml_tensor_nbytes(n_weights: int, gtype: str) -> int:
    """Bytes of `n_weights` weights (whole blocks) of ggml type `gtype`."""
    return int(round(n_weights * GGML_BPW[gtype] / 8))


def weightlets(bits: np.ndarray) -> np.ndarray:
    """Weightlet blocks per stripe of a B-bit weight: popcount(B) for B < 8 (1/2/4-bit weightlets); 8 bits are stored
    as plain bytes, one block (quant/pack/weightlet.py, native/src/ef_unpack.c)."""
    b = np.asarray(bits, dtype=np.int64)
    pop = (b & 1) + ((b >> 1) & 1) + ((b >> 2) & 1)
    return np.where(b >= 8, 1, pop)


def tensor_nbytes(bits: np.ndarray, d_in: int, fmt: str) -> int:
    """Bytes on flash of one tensor with per-output-channel `bits` (C,) and `d_in` weights per channel."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown weight format {fmt!r} (one of {FORMATS})")
    return int(packed_nbytes(np.asarray(bits), d_in, fmt))


def unpack_work(bits: np.ndarray, d_in: int, fmt: str) -> tuple[float, int]:
    """(SIMD instructions, INT8 bytes written) to unpack one tensor on the CPU; K-quant cost is in cycles (device)."""
    b = np.asarray(bits, dtype=np.int64)
    stripes = d_in / STRIPE
    if fmt == "weightlet":
        instr = float(((INSTR_PER_BLOCK_STRIPE * weightlets(b) + INSTR_FIXED_PER_STRIPE) * stripes).sum())
        return instr, b.size * d_in
    if fmt == "mixed":
        n4 = int((b <= 4).sum())
        return float(n4 * stripes * (INSTR_PER_BLOCK_STRIPE + INSTR_FIXED_PER_STRIPE)), n4 * d_in
    if fmt == "kquant":
        return 0.0, b.size * d_in
    if fmt == "int8":
        return 0.0, 0
    raise ValueError(f"unknown weight format {fmt!r} (one of {FORMATS})")


# ---- bit allocations ------------------------------------------------------------------------------------------------
def uniform_bits(spec: ModelSpec, budget: float) -> dict[str, np.ndarray]:
    """Every tensor: floor/ceil(budget) mix with mean exactly `budget` (deterministic; stand-in without the twin)."""
    out = {}
    lo = int(math.floor(budget))
    frac = budget - lo
    for kind, (c, _d) in spec.linear_shapes().items():
        n_hi = int(round(frac * c))
        row = np.full(c, lo, dtype=np.int8)
        row[:n_hi] = min(lo + 1, 8)
        out[kind] = np.tile(row, (spec.n_layers, 1))               # (L, C)
    return out


CACHE_DIR = Path(__file__).resolve().parents[1] / "outputs" / "cache" / "bits"


def model_bits(spec: ModelSpec, budget: float, seed: int = 0, source: str = "auto"
               ) -> tuple[dict[str, np.ndarray], str]:
    """Per tensor kind: (n_layers, C) bits of every output channel of every layer, and where they came from.

    source: auto (a model with real weights here: `real`; else the twin if `quant.twin` is available, else uniform)
    | real | twin | uniform. Twin allocations of a whole
    model take seconds, so they are cached on disk (`outputs/cache/bits/`), keyed by model shapes, budget, seed and a
    hash of the twin's statistics file.
    """
    if not 1 <= budget <= 8:
        raise ValueError(f"bits must be in 1..8 (got {budget})")
    if source == "real" or (source == "auto" and spec.weights.value == "real"):
        key = _cache_key(spec, budget, 0, "real")      # taken before computing: the inputs may change meanwhile
        cached = _cache_get(key)
        if cached is None:
            cached = real_bits(spec, budget)
            _cache_put(key, cached)
        return cached, "real"
    if source in ("auto", "twin"):
        key = _cache_key(spec, budget, seed)          # taken before sampling: the twin file may be refitted meanwhile
        cached = _cache_get(key)
        if cached is not None:
            return cached, "twin"
        try:
            from quant.twin import twin_bits  # type: ignore[attr-defined]
        except Exception as e:            # no silent fallback to uniform bits: uniform only when asked for
            raise ValueError(f"bits_source={source}: the quantizer twin (quant.twin) is not available ({e}); "
                             f"use bits_source=uniform to run with uniform bits") from None
        else:
            raw = twin_bits(spec, budget, seed)
            shapes = spec.linear_shapes()
            out = {}
            for kind, (c, _d) in shapes.items():
                if kind not in raw:
                    raise ValueError(f"quant.twin.twin_bits returned no bits for tensor kind {kind!r}")
                out[kind] = np.asarray(raw[kind]).reshape(spec.n_layers, c).astype(np.int8)
            _cache_put(key, out)
            return out, "twin"
    if source not in ("auto", "uniform"):
        raise ValueError(f"bits_source must be auto, real, twin or uniform (got {source!r})")
    return uniform_bits(spec, budget), "uniform"


def real_bits(spec: ModelSpec, budget: float) -> dict[str, np.ndarray]:
    """The quantizer's allocation (`quant.allocate.allocate`, one global budget, channel cost = its D weights) on the
    real model's per-channel statistics (max |w|, mean w^2 of the dequantized GGUF weights; no smoothing)."""
    from quant.allocate import allocate
    from quant.gguf_model import load_weights

    w = load_weights(spec)
    shapes = spec.linear_shapes()
    m, s, cost, spans = [], [], [], []
    for kind, (c, d) in shapes.items():
        rows = np.stack([np.asarray(w[f"blk.{i}.{kind}.weight"], dtype=np.float64) for i in range(spec.n_layers)])
        rows = rows.reshape(spec.n_layers * c, d)                            # (L*C, D), layer-major
        m.append(np.abs(rows).max(axis=1))
        s.append((rows * rows).mean(axis=1))
        cost.append(np.full(rows.shape[0], float(d)))
        spans.append((kind, c))
    bits = allocate(np.concatenate(m), np.concatenate(s), budget, cost=np.concatenate(cost))
    out, at = {}, 0
    for kind, c in spans:
        out[kind] = bits[at:at + spec.n_layers * c].reshape(spec.n_layers, c).astype(np.int8)
        at += spec.n_layers * c
    return out


def _allocator_code_hash(tag: str) -> str:
    """Hash of the source of the modules that compute an allocation (the allocator, and the twin for twin bits)."""
    import importlib
    import inspect

    h = hashlib.sha1()
    for mod in ("quant.allocate",) + (("quant.twin",) if tag != "real" else ()):
        h.update(inspect.getsource(importlib.import_module(mod)).encode())
    return h.hexdigest()


def _cache_key(spec: ModelSpec, budget: float, seed: int, tag: str = "twin") -> Path | None:
    try:
        if tag == "real":
            from quant.gguf_model import gguf_path

            st = Path(gguf_path(spec)).stat()
            h = hashlib.sha1(f"{gguf_path(spec)}|{st.st_size}|{st.st_mtime_ns}".encode())
        else:
            from quant.twin import twin_path  # type: ignore[attr-defined]

            h = hashlib.sha1(Path(twin_path()).read_bytes())
    except Exception:
        return None
    h.update(repr(sorted(spec.linear_shapes().items())).encode())
    h.update(f"{spec.n_layers}|{budget:.6f}|{seed}".encode())
    h.update(_allocator_code_hash(tag).encode())        # a changed allocator invalidates its cached allocations
    from quant.arch import check_name

    try:                                # the file name embeds model.name: only a validated name, under CACHE_DIR
        path = CACHE_DIR / f"{tag}_{check_name(spec.name, 'model.name')}_{budget:g}_{seed}_{h.hexdigest()[:16]}.npz"
    except ValueError:
        return None
    return path if path.resolve().parent == CACHE_DIR.resolve() else None


def _cache_get(path: Path | None) -> dict[str, np.ndarray] | None:
    if path is None or not path.is_file():
        return None
    try:
        with np.load(path) as z:
            return {k: z[k] for k in z.files}
    except Exception:       # a damaged cache entry is recomputed
        return None


def _cache_put(path: Path | None, bits: dict[str, np.ndarray]) -> None:
    if path is None:
        return
    buf = io.BytesIO()
    np.savez(buf, **bits)
    atomic_write_bytes(path, buf.getvalue())


def bits_histogram(bits: dict[str, np.ndarray], spec: ModelSpec) -> dict[int, float]:
    """Fraction of weights at each width 1..8 (weighted by channel length, as Fig. 4a counts weights)."""
    counts = np.zeros(9)
    for kind, (_c, d) in spec.linear_shapes().items():
        counts += np.bincount(bits[kind].ravel().astype(np.int64), minlength=9)[:9] * d
    return {b: float(counts[b] / counts.sum()) for b in range(1, 9)}
