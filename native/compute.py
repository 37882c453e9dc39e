"""Python binding of the native compute kernels of the host hardware-in-the-loop runner (native/src/ef_gemm.c,
native/src/ef_ops.c; EdgeFlow paper §3.2 / §4.1: W8A8 linear layers on the NPU stand-in, float32 Llama ops on the
CPU; docs/hil.md "Native compute kernels").

Owns: argument checks (dtype, C-contiguity, shapes, ranges: one-line ValueError naming the argument) and zero-copy
ctypes calls; ctypes releases the GIL during each call, so threads that split a GEMM's columns (`n0`/`n1`, or
`threads=`) or an op's rows really run in parallel. Every function takes `isa=` (default: the ISA forced with
`native.force_isa`, else the fastest available: `native.available_compute_isas()`) and `out=` (a preallocated
result, so hot loops do not allocate). The NumPy references with the same signatures are in quant/ref_ops.py.

    gemm_i8_i32(x (M,K) i8, w (N,K) i8) -> (M,N) i32      out[m,n] = sum_k x[m,k] w[n,k], exact
    GemmPool(helpers).gemm(x, w, out, threads)           the same GEMM split over persistent native threads
    linear_w8a8(x (M,K) f32, act_scale, w (N,K) i8, w_scale (N,)) -> (M,N) f32   quantize -> GEMM -> dequant
    rmsnorm, rope (in place), attention, silu_mul, add, quantize_i8, dequant_i32, absmax
    aligned(shape, dtype), aligned_copy(a) -> zero-filled array / copy whose data starts on a SIMD_ALIGN (64 B) boundary

Alignment: the kernels accept any address, but the AVX-512 GEMM and attention load whole 64-byte vectors, and an
operand that does not start on a cache line splits every load across two lines. Measured on an AMD EPYC (Zen 5) VM,
thread CPU time, median of 100 calls: 128 x 576 x 1536 INT8 GEMM 445 us with x and w 64-byte aligned, 505
with x at +16 or +32 B, 499 with w at +16, 587 with every operand at +16 (+32 %); attention (128 tokens, 9 / 3 heads
of 64) 585 us aligned, 781 at +16 B; the elementwise ops within 0-12 %. NumPy and malloc give 16-byte alignment, so
which case a buffer hit depended on the heap's state: the runner and the calibration allocate every kernel operand
with `aligned` (docs/hil.md "Operand alignment").
"""
from __future__ import annotations

import ctypes as ct

import numpy as np

import native

_SIGS = {
    "ef_compute_isa_mask": (ct.c_uint32, []),
    "ef_compute_isa_best": (ct.c_int, []),
    "ef_compute_has_avx512vnni": (ct.c_int, []),
    "ef_gemm_i8_i32": (ct.c_int, [ct.c_int, ct.c_void_p, ct.c_void_p, ct.c_void_p, ct.c_int64, ct.c_int64,
                                  ct.c_int64, ct.c_int64, ct.c_int64]),
    "ef_rmsnorm_f32": (ct.c_int, [ct.c_int, ct.c_void_p, ct.c_void_p, ct.c_float, ct.c_void_p, ct.c_int64,
                                  ct.c_int64, ct.c_int64, ct.c_int64]),
    "ef_rope_f32": (ct.c_int, [ct.c_int, ct.c_void_p, ct.c_void_p, ct.c_void_p, ct.c_int64, ct.c_int64, ct.c_int64]),
    "ef_attention_f32": (ct.c_int, [ct.c_int, ct.c_void_p, ct.c_void_p, ct.c_void_p, ct.c_int64, ct.c_int64,
                                    ct.c_int64, ct.c_int64, ct.c_int64, ct.c_int64, ct.c_void_p, ct.c_int64,
                                    ct.c_int64]),
    "ef_silu_mul_f32": (ct.c_int, [ct.c_int, ct.c_void_p, ct.c_void_p, ct.c_void_p, ct.c_int64]),
    "ef_add_f32": (ct.c_int, [ct.c_int, ct.c_void_p, ct.c_void_p, ct.c_void_p, ct.c_int64]),
    "ef_quantize_f32_i8": (ct.c_int, [ct.c_int, ct.c_void_p, ct.c_float, ct.c_void_p, ct.c_int64]),
    "ef_dequant_i32_f32": (ct.c_int, [ct.c_int, ct.c_void_p, ct.c_float, ct.c_void_p, ct.c_void_p, ct.c_int64,
                                      ct.c_int64, ct.c_int64, ct.c_int64]),
    "ef_absmax_f32": (ct.c_float, [ct.c_int, ct.c_void_p, ct.c_int64]),
    "ef_pool_create": (ct.c_void_p, [ct.c_int]),
    "ef_pool_destroy": (None, [ct.c_void_p]),
    "ef_pool_helpers": (ct.c_int, [ct.c_void_p]),
    "ef_pool_set_spin": (ct.c_int, [ct.c_void_p, ct.c_long]),
    "ef_pool_set_pin": (ct.c_int, [ct.c_void_p, ct.c_int]),
    "ef_pool_gemm_i8_i32": (ct.c_int, [ct.c_void_p, ct.c_int, ct.c_int, ct.c_void_p, ct.c_void_p, ct.c_void_p,
                                       ct.c_int64, ct.c_int64, ct.c_int64, ct.c_int64, ct.c_int64]),
}
SIMD_ALIGN = 64          # B: one cache line = one AVX-512 vector (module doc "Alignment")
GEMM_KMAX = 65536        # EF_GEMM_KMAX: longest exact int32 dot product (native/src/ef_compute.h)
_LIB: ct.CDLL | None = None


def _lib() -> ct.CDLL:
    global _LIB
    if _LIB is None:
        lib = native._load()
        for name, (res, args) in _SIGS.items():
            f = getattr(lib, name)
            f.restype, f.argtypes = res, args
        _LIB = lib
    return _LIB


# ---- ISA -----------------------------------------------------------------------------------------------------------
def best_compute_isa() -> str:
    """The fastest compute ISA here (avx512 only with AVX-512 VNNI; else avxvnni, avx2, ...)."""
    return native.COMPUTE_ISAS[_lib().ef_compute_isa_best()]


def gemm_variant(isa: str | None = None) -> str:
    """Name of the GEMM kernel an ISA level runs on this CPU, e.g. 'avx512' -> 'avx512vnni' (labels benchmarks)."""
    name = _isa_name(isa)
    if name == "avx512":
        return "avx512vnni" if _lib().ef_compute_has_avx512vnni() else "avx2"
    return {"sse2": "auto"}.get(name, name)


def _isa_name(isa: str | None) -> str:
    name = isa if isa is not None else (native._FORCED or best_compute_isa())
    if name not in native.COMPUTE_ISAS:
        raise ValueError(f"isa: unknown {name!r} (one of {', '.join(native.COMPUTE_ISAS)})")
    if name not in native.available_compute_isas():
        raise native.NativeError(f"isa: {name!r} is not available on this CPU (available: "
                                 f"{', '.join(native.available_compute_isas())})")
    return name


def _isa(isa: str | None) -> int:
    return native.COMPUTE_ISAS.index(_isa_name(isa))


# ---- array checks --------------------------------------------------------------------------------------------------
def _arr(a, name: str, dtype, ndim: int | None = None, shape: tuple | None = None) -> np.ndarray:
    if not isinstance(a, np.ndarray) or a.dtype != dtype or not a.flags.c_contiguous:
        raise ValueError(f"{name}: must be a C-contiguous {np.dtype(dtype).name} array (got "
                         f"{type(a).__name__} {getattr(a, 'dtype', '')}"
                         f"{'' if not isinstance(a, np.ndarray) or a.flags.c_contiguous else ', non-contiguous'})")
    if ndim is not None and a.ndim != ndim:
        raise ValueError(f"{name}: must have {ndim} dimensions (got shape {a.shape})")
    if shape is not None and a.shape != shape:
        raise ValueError(f"{name}: shape {a.shape} != expected {shape}")
    return a


def aligned(shape, dtype, align: int = SIMD_ALIGN, offset: int = 0) -> np.ndarray:
    """Zero-filled C-contiguous array of `shape` / `dtype` whose first element sits on an `align`-byte boundary (a
    view into a slightly larger buffer; module doc "Alignment"); `offset` bytes past it instead (benchmarks of
    misaligned operands)."""
    dt = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    raw = np.zeros(n + align + offset, dtype=np.uint8)
    start = (-raw.ctypes.data) % align + offset
    return raw[start:start + n].view(dt).reshape(shape)


def aligned_copy(a: np.ndarray, align: int = SIMD_ALIGN, offset: int = 0) -> np.ndarray:
    """A C-contiguous copy of `a` starting on an `align`-byte boundary (`offset` bytes past it)."""
    out = aligned(a.shape, a.dtype, align, offset)
    out[...] = a
    return out


def _dst(out, name: str, shape: tuple, dtype) -> np.ndarray:
    if out is None:
        return aligned(shape, dtype)
    _arr(out, name, dtype, shape=shape)
    if not out.flags.writeable:
        raise ValueError(f"{name}: must be writable")
    return out


def _rng(lo: int, hi: int | None, size: int, what: str) -> tuple[int, int]:
    hi = size if hi is None else int(hi)
    if not 0 <= int(lo) <= hi <= size:
        raise ValueError(f"{what}: range [{lo}, {hi}) outside [0, {size})")
    return int(lo), hi


def _ok(rc: int, what: str) -> None:
    if rc != 0:
        raise native.NativeError(f"{what}: {native.ERRORS.get(rc, f'error {rc}')}")


def _p(a: np.ndarray) -> int:
    return a.ctypes.data


def _gemm_args(x, w, out, n0: int, n1: int | None) -> tuple[int, int, int, np.ndarray, int, int]:
    """Checked (M, K, N, out, n0, n1) of an INT8 GEMM call."""
    _arr(x, "x", np.int8, 2)
    _arr(w, "w", np.int8, 2)
    (M, K), N = x.shape, w.shape[0]
    if w.shape[1] != K:
        raise ValueError(f"w: shape {w.shape} needs {K} columns to match x {x.shape}")
    if K > GEMM_KMAX:
        raise ValueError(f"x: K = {K} > {GEMM_KMAX} (int32 accumulation would overflow)")
    out = _dst(out, "out", (M, N), np.int32)
    n0, n1 = _rng(n0, n1, N, "n0/n1")
    return M, K, N, out, n0, n1


# ---- INT8 GEMM -----------------------------------------------------------------------------------------------------
def gemm_i8_i32(x: np.ndarray, w: np.ndarray, out: np.ndarray | None = None, n0: int = 0, n1: int | None = None,
                threads: int = 1, isa: str | None = None) -> np.ndarray:
    """out (M, N) int32 = x (M, K) int8 @ w (N, K) int8 ^T, exact; only columns [n0, n1) are written (split N over
    threads by giving each its own range, or threads > 1 to split [n0, n1) here)."""
    M, K, N, out, n0, n1 = _gemm_args(x, w, out, n0, n1)
    i, f = _isa(isa), _lib().ef_gemm_i8_i32
    native._run(lambda a, b: f(i, _p(x), _p(w), _p(out), M, K, N, a, b), n0, n1, threads, "gemm_i8_i32")
    return out


class GemmPool:
    """`helpers` persistent native threads (native/src/ef_pool.c) that split a GEMM's output columns with the calling
    thread: one ctypes call per GEMM, and neither the helpers nor the split touch the interpreter (a Python thread
    pool takes the GIL to hand each part over and to return it). Use as a context manager, or call `close()`; one
    GEMM at a time (concurrent callers wait for each other).

    spin_us: a helper polls for the next GEMM this long after its part before it sleeps (as ggml's pool does; a
    sleeping helper's core halts on a VM and waking it cost ~50 us here). pin: pin the helpers to other CPUs than the
    calling thread's, so the kernel cannot queue a woken helper behind its caller (docs/hil.md "Runner")."""

    def __init__(self, helpers: int, spin_us: float = 0.0, pin: bool = False) -> None:
        self._h = None
        if not 0 <= int(helpers) <= 64:
            raise ValueError(f"helpers: must be in 0..64 (got {helpers})")
        if not 0 <= spin_us <= 1e6:
            raise ValueError(f"spin_us: must be in 0..1e6 (got {spin_us})")
        self.helpers, self.spin_us, self.pin = int(helpers), float(spin_us), bool(pin)
        self._lib = _lib()
        self._h = self._lib.ef_pool_create(self.helpers)
        if not self._h:
            raise native.NativeError(f"GemmPool: could not start {helpers} native threads")
        _ok(self._lib.ef_pool_set_spin(self._h, int(self.spin_us * 1e3)), "pool spin")
        _ok(self._lib.ef_pool_set_pin(self._h, int(self.pin)), "pool pin")
        self.raw = self._lib.ef_pool_gemm_i8_i32      # (handle, threads, isa, x, w, out, M, K, N, n0, n1) -> rc

    @property
    def handle(self) -> int:
        if not self._h:
            raise ValueError("GemmPool: closed")
        return self._h

    def gemm(self, x: np.ndarray, w: np.ndarray, out: np.ndarray | None = None, threads: int = 1, n0: int = 0,
             n1: int | None = None, isa: str | None = None) -> np.ndarray:
        """gemm_i8_i32 over columns [n0, n1), split into min(threads, helpers + 1) parts (bit-identical)."""
        if threads < 1:
            raise ValueError(f"threads must be >= 1 (got {threads})")
        M, K, N, out, n0, n1 = _gemm_args(x, w, out, n0, n1)
        _ok(self.raw(self.handle, int(threads), _isa(isa), _p(x), _p(w), _p(out), M, K, N, n0, n1), "pool gemm_i8_i32")
        return out

    def close(self) -> None:
        """Stop and join the helper threads (idempotent)."""
        if getattr(self, "_h", None):
            h, self._h = self._h, None
            self._lib.ef_pool_destroy(h)

    def __enter__(self) -> "GemmPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


def linear_w8a8(x: np.ndarray, act_scale: float, w: np.ndarray, w_scale: np.ndarray, out: np.ndarray | None = None,
                threads: int = 1, isa: str | None = None, x8: np.ndarray | None = None,
                acc: np.ndarray | None = None) -> np.ndarray:
    """W8A8 linear layer (quant/export.py runtime semantics): x8 = clamp(rint(x / act_scale), ±127);
    y (M, N) float32 = (x8 @ w^T) * (act_scale * w_scale[n]).  x (M, K) float32, w (N, K) int8, w_scale (N,);
    x8 (M, K) int8 and acc (M, N) int32 are optional scratch buffers (no allocation in a hot loop)."""
    _arr(x, "x", np.float32, 2)
    x8 = quantize_i8(x, act_scale, out=x8, isa=isa)
    acc = gemm_i8_i32(x8, w, out=acc, threads=threads, isa=isa)
    return dequant_i32(acc, act_scale, w_scale, out=out, isa=isa)


# ---- float ops -----------------------------------------------------------------------------------------------------
def rmsnorm(x: np.ndarray, g: np.ndarray, eps: float, out: np.ndarray | None = None, r0: int = 0,
            r1: int | None = None, isa: str | None = None) -> np.ndarray:
    """out (M, d) = x / sqrt(mean(x^2, -1) + eps) * g for rows [r0, r1); x (M, d) float32, g (d,) float32."""
    _arr(x, "x", np.float32, 2)
    M, d = x.shape
    _arr(g, "g", np.float32, shape=(d,))
    if not eps >= 0:
        raise ValueError(f"eps: must be >= 0 (got {eps})")
    out = _dst(out, "out", (M, d), np.float32)
    r0, r1 = _rng(r0, r1, M, "r0/r1")
    if d:
        _ok(_lib().ef_rmsnorm_f32(_isa(isa), _p(x), _p(g), float(eps), _p(out), M, d, r0, r1), "rmsnorm")
    return out


def rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, isa: str | None = None) -> np.ndarray:
    """Rotate adjacent pairs (0,1), (2,3), ... of every head IN PLACE (quant/llama.py apply_rope) and return x.
    x (T, H, hd) float32, hd even; cos, sin (T, hd/2) float32."""
    _arr(x, "x", np.float32, 3)
    T, H, hd = x.shape
    if hd < 2 or hd % 2:
        raise ValueError(f"x: head_dim {hd} must be even and >= 2")
    _arr(cos, "cos", np.float32, shape=(T, hd // 2))
    _arr(sin, "sin", np.float32, shape=(T, hd // 2))
    if not x.flags.writeable:
        raise ValueError("x: must be writable (rope works in place)")
    _ok(_lib().ef_rope_f32(_isa(isa), _p(x), _p(cos), _p(sin), T, H, hd), "rope")
    return x


def attention(q: np.ndarray, kcache: np.ndarray, vcache: np.ndarray, past: int, out: np.ndarray | None = None,
              h0: int = 0, h1: int | None = None, isa: str | None = None) -> np.ndarray:
    """Causal grouped-query attention of m new queries at positions past..past+m-1 (heads [h0, h1) written).
    q (m, H, hd), kcache / vcache (ctx_cap, KV, hd) float32 with rows 0..past+m-1 filled -> out (m, H*hd)."""
    _arr(q, "q", np.float32, 3)
    m, H, hd = q.shape
    _arr(kcache, "kcache", np.float32, 3)
    cap, KV, hdk = kcache.shape
    _arr(vcache, "vcache", np.float32, shape=kcache.shape)
    if hdk != hd or KV < 1 or H % KV:
        raise ValueError(f"kcache: shape {kcache.shape} does not fit q {q.shape} (same head_dim, H % KV == 0)")
    if not (0 <= int(past) and int(past) + m <= cap):
        raise ValueError(f"past: {past} + {m} queries exceed the cache capacity {cap}")
    out = _dst(out, "out", (m, H * hd), np.float32)
    h0, h1 = _rng(h0, h1, H, "h0/h1")
    _ok(_lib().ef_attention_f32(_isa(isa), _p(q), _p(kcache), _p(vcache), cap, int(past), m, H, KV, hd, _p(out),
                                h0, h1), "attention")
    return out


def _same(a: np.ndarray, b: np.ndarray, an: str, bn: str) -> None:
    _arr(a, an, np.float32)
    _arr(b, bn, np.float32, shape=a.shape)


def silu_mul(g: np.ndarray, u: np.ndarray, out: np.ndarray | None = None, isa: str | None = None) -> np.ndarray:
    """out = g / (1 + exp(-g)) * u elementwise (the SwiGLU FFN), float32, any shape."""
    _same(g, u, "g", "u")
    out = _dst(out, "out", g.shape, np.float32)
    _ok(_lib().ef_silu_mul_f32(_isa(isa), _p(g), _p(u), _p(out), g.size), "silu_mul")
    return out


def add(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None, isa: str | None = None) -> np.ndarray:
    """out = a + b elementwise (the residual), float32, any shape; out may be a or b."""
    _same(a, b, "a", "b")
    out = _dst(out, "out", a.shape, np.float32)
    _ok(_lib().ef_add_f32(_isa(isa), _p(a), _p(b), _p(out), a.size), "add")
    return out


def quantize_i8(x: np.ndarray, scale: float, out: np.ndarray | None = None, isa: str | None = None) -> np.ndarray:
    """int8 codes clamp(rint(x / scale), -127, 127) (float32 division, half to even; scale <= 0 -> zeros), the codes
    of quant/quantize.py fake_quant_act, bit-exact."""
    _arr(x, "x", np.float32)
    out = _dst(out, "out", x.shape, np.int8)
    _ok(_lib().ef_quantize_f32_i8(_isa(isa), _p(x), float(np.float32(scale)), _p(out), x.size), "quantize_i8")
    return out


def dequant_i32(acc: np.ndarray, x_scale: float, w_scale: np.ndarray, out: np.ndarray | None = None, r0: int = 0,
                r1: int | None = None, isa: str | None = None) -> np.ndarray:
    """out (M, N) float32 = float32(acc) * (float32(x_scale) * w_scale[n]) for rows [r0, r1), bit-exact with NumPy.
    acc (M, N) int32, w_scale (N,) float32."""
    _arr(acc, "acc", np.int32, 2)
    M, N = acc.shape
    _arr(w_scale, "w_scale", np.float32, shape=(N,))
    out = _dst(out, "out", (M, N), np.float32)
    r0, r1 = _rng(r0, r1, M, "r0/r1")
    _ok(_lib().ef_dequant_i32_f32(_isa(isa), _p(acc), float(np.float32(x_scale)), _p(w_scale), _p(out), M, N, r0,
                                  r1), "dequant_i32")
    return out


def absmax(x: np.ndarray, isa: str | None = None) -> float:
    """max |x| (0.0 for an empty array), float32 input of any shape: a dynamic per-tensor activation scale."""
    _arr(x, "x", np.float32)
    return float(_lib().ef_absmax_f32(_isa(isa), _p(x), x.size))
