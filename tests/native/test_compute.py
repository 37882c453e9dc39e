"""Native compute kernels (native/compute.py) against the NumPy references of quant/ref_ops.py, every kernel on
every compute ISA this machine runs (forced globally, one at a time): integer kernels bit-exact, float kernels
within the named tolerances; odd sizes hit the SIMD tails, extremes and zero scales the edge cases."""
import threading

import numpy as np
import pytest

import native
from native import compute as C
from quant import ref_ops as R
from quant.llama import rope_tables
from quant.quantize import fake_quant_act
from tests.conftest import gemm_helper_tids, gemm_helpers_gone

SIZES = (1, 3, 17, 63, 64, 65, 577)


@pytest.fixture(params=native.available_compute_isas())
def cisa(request):
    """Every compute ISA here (incl. the compute-only levels such as avxvnni), forced for the test."""
    with native.force_isa(request.param):
        yield request.param


def i8(rng, *shape, lo=-127):
    return rng.integers(lo, 128, shape).astype(np.int8)


def close(got, want, rtol, atol):
    err = np.abs(got.astype(np.float64) - want.astype(np.float64))
    bad = err > atol + rtol * np.abs(want.astype(np.float64))
    assert not bad.any(), f"{bad.sum()} of {bad.size} beyond tolerance, max err {err.max():.3g}"


# ---- GEMM ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("M", (1, 3, 4, 17, 64, 65))
def test_gemm_odd_sizes_bit_exact(cisa, M):
    rng = np.random.default_rng(M)
    for K in SIZES:
        for N in (1, 3, 4, 17, 65):
            x, w = i8(rng, M, K), i8(rng, N, K, lo=-128)
            assert np.array_equal(C.gemm_i8_i32(x, w), R.gemm_i8_i32(x, w)), (cisa, M, K, N)


def test_gemm_long_k_chunks(cisa):
    """K beyond one 2048-byte K chunk: partial sums of the chunks add up exactly (also with column ranges)."""
    rng = np.random.default_rng(10)
    for M, K, N in ((5, 2047, 7), (4, 2048, 8), (6, 2049, 5), (9, 4673, 13), (1, 6000, 9)):
        x, w = i8(rng, M, K, lo=-128), i8(rng, N, K, lo=-128)
        assert np.array_equal(C.gemm_i8_i32(x, w), R.gemm_i8_i32(x, w)), (cisa, M, K, N)
        out = np.full((M, N), 5, np.int32)
        C.gemm_i8_i32(x, w, out=out, n0=1, n1=N - 1)
        assert np.array_equal(out[:, 1:-1], R.gemm_i8_i32(x, w)[:, 1:-1]) and (out[:, [0, -1]] == 5).all()


def test_gemm_extremes(cisa):
    """±127 everywhere (largest sums), -128 weights and activations too: still exact, no saturation."""
    K = 1000
    for xv, wv in ((127, 127), (-127, 127), (127, -128), (-128, -128), (-127, -128)):
        x = np.full((5, K), xv, np.int8)
        w = np.full((6, K), wv, np.int8)
        got = C.gemm_i8_i32(x, w)
        assert (got == xv * wv * K).all(), (cisa, xv, wv)
    rng = np.random.default_rng(1)
    x = rng.choice(np.array([-128, -127, 127], np.int8), (9, 4099))
    w = rng.choice(np.array([-128, 127], np.int8), (7, 4099))
    assert np.array_equal(C.gemm_i8_i32(x, w), R.gemm_i8_i32(x, w))


def test_gemm_column_ranges_and_threads(cisa):
    rng = np.random.default_rng(2)
    x, w = i8(rng, 13, 200), i8(rng, 37, 200)
    want = R.gemm_i8_i32(x, w)
    out = np.full((13, 37), -7, np.int32)
    C.gemm_i8_i32(x, w, out=out, n0=5, n1=22)
    assert np.array_equal(out[:, 5:22], want[:, 5:22])
    assert (out[:, :5] == -7).all() and (out[:, 22:] == -7).all()          # other columns untouched
    for a, b in ((0, 5), (22, 37)):
        C.gemm_i8_i32(x, w, out=out, n0=a, n1=b)
    assert np.array_equal(out, want)
    assert np.array_equal(C.gemm_i8_i32(x, w, threads=2), want)
    out2 = np.zeros_like(out)                                               # two Python threads, disjoint columns
    ts = [threading.Thread(target=C.gemm_i8_i32, args=(x, w), kwargs=dict(out=out2, n0=a, n1=b))
          for a, b in ((0, 18), (18, 37))]
    [t.start() for t in ts]
    [t.join() for t in ts]
    assert np.array_equal(out2, want)


@pytest.mark.parametrize("helpers,spin_us,pin", ((0, 0, False), (1, 0, False), (3, 0, False), (1, 100, True),
                                                 (3, 50, True), (2, 1000, False)))
def test_gemm_pool_splits_bit_exact(cisa, helpers, spin_us, pin):
    """The native pool's split (caller + persistent helpers) gives the one-call result on odd sizes, for every
    thread count (more threads than helpers or columns included), on column sub-ranges, and stops its threads —
    also with helpers that poll for the next job (spin_us) and helpers pinned away from the caller's CPU."""
    rng = np.random.default_rng(3)
    before = gemm_helper_tids()              # helpers of pools other tests left to the garbage collector may end
    with C.GemmPool(helpers, spin_us=spin_us, pin=pin) as pool:
        ours = gemm_helper_tids() - before
        assert len(ours) == helpers
        for M, K, N in ((1, 5, 1), (3, 33, 2), (17, 65, 37), (4, 577, 63)):
            x, w = i8(rng, M, K), i8(rng, N, K)
            want = R.gemm_i8_i32(x, w)
            for threads in (1, 2, 3, 7):
                assert np.array_equal(pool.gemm(x, w, threads=threads), want)
                out = np.full((M, N), -7, np.int32)
                pool.gemm(x, w, out=out, threads=threads, n0=N // 3, n1=N)
                assert np.array_equal(out[:, N // 3:], want[:, N // 3:]) and (out[:, :N // 3] == -7).all()
        with pytest.raises(ValueError, match="^threads"):
            pool.gemm(x, w, threads=0)
        with pytest.raises(ValueError, match="^w: shape"):
            pool.gemm(x, i8(rng, 3, K + 1))
    assert gemm_helpers_gone(ours)
    with pytest.raises(ValueError, match="closed"):
        pool.gemm(x, w)
    with pytest.raises(ValueError, match="^helpers"):
        C.GemmPool(-1)
    with pytest.raises(ValueError, match="^spin_us"):
        C.GemmPool(1, spin_us=-1)


def _allowed(tid: int) -> set[int]:
    line = next(ln for ln in open(f"/proc/self/task/{tid}/status") if ln.startswith("Cpus_allowed_list"))
    out: set[int] = set()
    for part in line.split()[1].split(","):
        a, _, b = part.partition("-")
        out |= set(range(int(a), int(b or a) + 1))
    return out


def test_gemm_pool_pins_helpers_away_from_the_caller():
    """pin=True: after a GEMM, every helper may run only on one CPU, not the caller's (when the process has two or
    more); pin=False leaves them on every CPU the process has."""
    import os
    import threading
    cpus = os.sched_getaffinity(0)
    if len(cpus) < 2:
        pytest.skip("one CPU: nothing to pin away from")
    rng = np.random.default_rng(4)
    x, w = i8(rng, 4, 64), i8(rng, 40, 64)
    before = gemm_helper_tids()
    for pin in (True, False):
        with C.GemmPool(2, pin=pin) as pool:
            helpers = sorted(gemm_helper_tids() - before)
            assert len(helpers) == 2
            me = threading.get_native_id()
            old = os.sched_getaffinity(me)
            try:
                os.sched_setaffinity(me, {min(cpus)})     # the caller stays on one CPU for the check
                assert np.array_equal(pool.gemm(x, w, threads=3), R.gemm_i8_i32(x, w))
                for t in helpers:
                    a = _allowed(t)
                    assert (len(a) == 1 and min(cpus) not in a) if pin else a == cpus
            finally:
                os.sched_setaffinity(me, old)
        assert gemm_helpers_gone(set(helpers))          # before the next pool's helpers are counted


def test_gemm_empty_and_bad_input():
    x = np.zeros((0, 8), np.int8)
    assert C.gemm_i8_i32(x, np.zeros((3, 8), np.int8)).shape == (0, 3)
    assert np.array_equal(C.gemm_i8_i32(np.ones((2, 0), np.int8), np.ones((3, 0), np.int8)), np.zeros((2, 3)))
    with pytest.raises(ValueError, match="^w: shape"):
        C.gemm_i8_i32(np.zeros((2, 8), np.int8), np.zeros((3, 9), np.int8))
    with pytest.raises(ValueError, match="^x: must be a C-contiguous int8"):
        C.gemm_i8_i32(np.zeros((2, 8), np.float32), np.zeros((3, 8), np.int8))
    with pytest.raises(ValueError, match="non-contiguous"):
        C.gemm_i8_i32(np.zeros((8, 8), np.int8)[:, ::2], np.zeros((3, 4), np.int8))
    with pytest.raises(ValueError, match="^n0/n1"):
        C.gemm_i8_i32(np.zeros((2, 8), np.int8), np.zeros((3, 8), np.int8), n0=2, n1=4)
    with pytest.raises(ValueError, match="^out: shape"):
        C.gemm_i8_i32(np.zeros((2, 8), np.int8), np.zeros((3, 8), np.int8), out=np.zeros((3, 2), np.int32))
    with pytest.raises(ValueError, match="^isa: unknown"):
        C.gemm_i8_i32(np.zeros((2, 8), np.int8), np.zeros((3, 8), np.int8), isa="mmx")


def test_isa_lists():
    cis = native.available_compute_isas()
    assert cis[:len(native.available_isas())] == native.available_isas()
    assert C.best_compute_isa() in cis
    if "avxvnni" in cis:                       # a compute-only level forced: unpack runs its base ISA
        with native.force_isa("avxvnni"):
            assert native._isa_index(None) == native.ISAS.index("avx2")


# ---- quantize / dequant / linear -----------------------------------------------------------------------------------
def test_quantize_bit_exact_with_fake_quant_act(cisa):
    rng = np.random.default_rng(3)
    for n in SIZES + (1000,):
        x = (rng.standard_normal(n) * 3).astype(np.float32)
        x[: n // 3] *= 40                                                   # saturating values
        s = 0.05
        if n >= 4:                                                          # exact .5 ties: half to even
            x[:4] = np.array([0.5, 1.5, -2.5, 126.5], np.float32) * np.float32(s)
        got = C.quantize_i8(x, s)
        assert np.array_equal(got, R.quantize_i8(x, s)), (cisa, n)
        assert np.array_equal(got.astype(np.float32) * np.float32(s), fake_quant_act(x, s))
        assert got.max() <= 127 and got.min() >= -127
    x = rng.standard_normal((3, 17)).astype(np.float32)
    for s in (0.0, -1.0):
        assert not C.quantize_i8(x, s).any()
        assert not fake_quant_act(x, s).any()


def test_dequant_bit_exact(cisa):
    rng = np.random.default_rng(4)
    for M, N in ((1, 1), (3, 17), (65, 63), (4, 577)):
        acc = rng.integers(-2 ** 31, 2 ** 31, (M, N)).astype(np.int32)
        ws = (rng.random(N) * 1e-2).astype(np.float32)
        ws[0] = 0.0
        xs = 0.0173
        assert np.array_equal(C.dequant_i32(acc, xs, ws), R.dequant_i32(acc, xs, ws)), (cisa, M, N)
        out = np.full((M, N), 9.0, np.float32)
        C.dequant_i32(acc, xs, ws, out=out, r0=M // 2, r1=M)
        assert np.array_equal(out[M // 2:], R.dequant_i32(acc, xs, ws)[M // 2:]) and (out[:M // 2] == 9).all()


def test_linear_w8a8(cisa):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((7, 577)).astype(np.float32)
    w = i8(rng, 65, 577, lo=-128)
    ws = (rng.random(65) * 0.01).astype(np.float32)
    a = float(np.abs(x).max()) / 127
    want = R.linear_w8a8(x, a, w, ws)
    assert np.array_equal(C.linear_w8a8(x, a, w, ws), want)
    x8, acc, out = np.empty((7, 577), np.int8), np.empty((7, 65), np.int32), np.empty((7, 65), np.float32)
    assert C.linear_w8a8(x, a, w, ws, out=out, x8=x8, acc=acc) is out and np.array_equal(out, want)


def test_add_absmax_exact(cisa):
    rng = np.random.default_rng(6)
    for n in SIZES:
        a, b = rng.standard_normal((2, n)).astype(np.float32)
        assert np.array_equal(C.add(a, b), R.add(a, b))
        assert C.absmax(a) == R.absmax(a)
        out = a.copy()
        C.add(out, b, out=out)                                              # in place
        assert np.array_equal(out, a + b)
    assert C.absmax(np.zeros(0, np.float32)) == 0.0
    x = np.zeros(100, np.float32)
    x[77] = -3.5
    assert C.absmax(x) == 3.5


# ---- float ops -----------------------------------------------------------------------------------------------------
def test_rmsnorm(cisa):
    rng = np.random.default_rng(7)
    for M in (1, 3, 17):
        for d in SIZES:
            x = (rng.standard_normal((M, d)) * 4).astype(np.float32)
            g = rng.standard_normal(d).astype(np.float32)
            close(C.rmsnorm(x, g, 1e-5), R.rmsnorm(x, g, 1e-5), R.RMSNORM_RTOL, R.RMSNORM_ATOL)
    out = np.full((4, 64), 5.0, np.float32)
    x = rng.standard_normal((4, 64)).astype(np.float32)
    C.rmsnorm(x, np.ones(64, np.float32), 1e-6, out=out, r0=1, r1=3)
    assert (out[0] == 5).all() and (out[3] == 5).all() and not (out[1:3] == 5).any()
    with pytest.raises(ValueError, match="^g: shape"):
        C.rmsnorm(x, np.ones(63, np.float32), 1e-6)


def test_rope_exact(cisa):
    rng = np.random.default_rng(8)
    for T, H, hd in ((1, 1, 2), (3, 9, 64), (17, 3, 6), (5, 2, 18)):
        cos, sin = rope_tables(T + 40, hd, 10000.0)
        cos, sin = cos[40:].copy(), sin[40:].copy()
        x = rng.standard_normal((T, H, hd)).astype(np.float32)
        want = R.rope(x, cos, sin)
        got = x.copy()
        assert C.rope(got, cos, sin) is got
        assert np.array_equal(got, want), (cisa, T, H, hd)
    with pytest.raises(ValueError, match="^x: head_dim"):
        C.rope(np.zeros((1, 1, 3), np.float32), np.zeros((1, 1), np.float32), np.zeros((1, 1), np.float32))


def test_silu_mul(cisa):
    rng = np.random.default_rng(9)
    for n in SIZES + (4096,):
        g = (rng.standard_normal(n) * 6).astype(np.float32)
        u = rng.standard_normal(n).astype(np.float32)
        if n >= 4:
            g[:4] = [-100.0, 100.0, 0.0, -87.0]
        close(C.silu_mul(g, u), R.silu_mul(g, u), R.SILU_RTOL, R.SILU_ATOL)


@pytest.mark.parametrize("past,m,H,KV,hd", [(0, 1, 1, 1, 8), (0, 17, 9, 3, 64), (5, 1, 4, 2, 6),
                                            (40, 3, 8, 8, 17), (0, 65, 2, 1, 64), (1100, 2, 2, 1, 16)])
def test_attention(cisa, past, m, H, KV, hd):
    rng = np.random.default_rng(past + m)
    cap = past + m + 3
    q = rng.standard_normal((m, H, hd)).astype(np.float32)
    kc = (rng.standard_normal((cap, KV, hd)) * 2).astype(np.float32)
    vc = rng.standard_normal((cap, KV, hd)).astype(np.float32)
    kc[past + m:] = np.nan                                                 # rows beyond the context never read
    close(C.attention(q, kc, vc, past), R.attention(q, kc, vc, past), R.ATTENTION_RTOL, R.ATTENTION_ATOL)
    out = np.full((m, H * hd), 3.0, np.float32)
    C.attention(q, kc, vc, past, out=out, h0=H - 1, h1=H)
    assert (out[:, : (H - 1) * hd] == 3).all()
    close(out[:, (H - 1) * hd:], R.attention(q, kc, vc, past)[:, (H - 1) * hd:], R.ATTENTION_RTOL,
          R.ATTENTION_ATOL)


def test_attention_bad_input():
    q = np.zeros((2, 4, 8), np.float32)
    kc = np.zeros((3, 2, 8), np.float32)
    with pytest.raises(ValueError, match="^past"):
        C.attention(q, kc, kc.copy(), past=2)
    with pytest.raises(ValueError, match="^kcache"):
        C.attention(q, np.zeros((3, 3, 8), np.float32), np.zeros((3, 3, 8), np.float32), past=0)


@pytest.mark.parametrize("shape,dtype", [((0,), np.int8), ((7,), np.float32), ((3, 5), np.int32),
                                         ((2, 3, 65), np.int8)])
def test_aligned_buffers(shape, dtype):
    a = C.aligned(shape, dtype)
    assert a.shape == shape and a.dtype == dtype and a.flags.c_contiguous and a.flags.writeable
    assert (a.size == 0 or a.ctypes.data % C.SIMD_ALIGN == 0) and not a.any()
    src = np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape)
    b = C.aligned_copy(src)
    assert (b.size == 0 or b.ctypes.data % C.SIMD_ALIGN == 0) and np.array_equal(b, src)
    assert not np.shares_memory(b, src)
    assert C.aligned((4,), np.int8, align=4096).ctypes.data % 4096 == 0
    assert C.aligned((4,), np.int32, offset=16).ctypes.data % C.SIMD_ALIGN == 16


def test_default_outputs_are_aligned(cisa):
    x = np.ones((3, 64), np.int8)
    w = np.ones((5, 64), np.int8)
    assert C.gemm_i8_i32(x, w, isa=cisa).ctypes.data % C.SIMD_ALIGN == 0
