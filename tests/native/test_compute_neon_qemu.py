"""NEON compute kernels (plain NEON and NEON + dotprod), cross-compiled for aarch64 and run under qemu-aarch64,
checked against the NumPy references of quant/ref_ops.py: GEMM, quantize, dequant, add, absmax and RoPE bit-exactly,
rmsnorm / silu_mul / attention within the named tolerances (docs/hil.md "Native compute kernels").

The harness (native/harness/ef_harness.c, kinds 5..12) is compiled statically once per module; without
`aarch64-linux-gnu-gcc` or `qemu-aarch64` the tests skip and say how to get them (`make cross-tools`).
"""
import struct
import subprocess
from pathlib import Path

import numpy as np

from quant import ref_ops as R
from quant.llama import rope_tables

ROOT = Path(__file__).resolve().parents[2]
CC, QEMU = "aarch64-linux-gnu-gcc", "qemu-aarch64"
ISAS = ("ref", "neon", "neondot")      # qemu-aarch64's default cpu (max) has the dotprod extension


def f32bits(v: float) -> int:
    return struct.unpack("<I", struct.pack("<f", v))[0]


def run(exe: Path, cases: list[tuple[int, list[int], bytes]]) -> list[dict[str, tuple[int, bytes]]]:
    """cases: (kind, params, payload) -> per case {isa: (rc, output bytes)}."""
    d = exe.parent
    buf = [struct.pack("<I", len(cases))]
    for kind, params, payload in cases:
        pb = struct.pack(f"<{len(params)}Q", *params)
        buf += [struct.pack("<IIQQQ", kind, 0, 0, 0, len(pb)), pb, struct.pack("<Q", len(payload)), payload]
    (d / "cin.bin").write_bytes(b"".join(buf))
    r = subprocess.run([QEMU, str(exe), str(d / "cin.bin"), str(d / "cout.bin"), ",".join(ISAS)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"harness failed ({r.returncode}): {r.stderr}"
    out, at, res = (d / "cout.bin").read_bytes(), 0, []
    for _ in cases:
        per = {}
        for isa in ISAS:
            rc, n = struct.unpack_from("<iQ", out, at)
            per[isa] = (rc, out[at + 12: at + 12 + n])
            at += 12 + n
        res.append(per)
    assert at == len(out)
    return res


def close(got, want, rtol, atol):
    err = np.abs(got.astype(np.float64) - want.astype(np.float64))
    assert (err <= atol + rtol * np.abs(want.astype(np.float64))).all(), f"max err {err.max():.3g}"


def test_neon_gemm_bit_exact(harness):
    rng = np.random.default_rng(11)
    cases, want = [], []
    for M, K, N in ((1, 1, 1), (3, 17, 5), (4, 64, 4), (17, 577, 65), (65, 63, 3), (1, 576, 33), (6, 4673, 9)):
        x = rng.integers(-128, 128, (M, K)).astype(np.int8)
        w = rng.integers(-128, 128, (N, K)).astype(np.int8)
        if M > 1:
            x[0], w[0] = -128, -128                                          # extremes
        cases.append((5, [M, K, N, 0, N], x.tobytes() + w.tobytes()))
        want.append(R.gemm_i8_i32(x, w))
    x, w = rng.integers(-127, 128, (5, 40)).astype(np.int8), rng.integers(-128, 128, (9, 40)).astype(np.int8)
    cases.append((5, [5, 40, 9, 2, 7], x.tobytes() + w.tobytes()))             # column range
    ref = np.zeros((5, 9), np.int32)
    ref[:, 2:7] = R.gemm_i8_i32(x, w)[:, 2:7]
    want.append(ref)
    for per, wnt in zip(run(harness, cases), want):
        for isa, (rc, b) in per.items():
            assert rc == 0 and np.array_equal(np.frombuffer(b, np.int32).reshape(wnt.shape), wnt), isa


def test_neon_ops(harness):
    rng = np.random.default_rng(12)
    n = 1003
    x = (rng.standard_normal(n) * 5).astype(np.float32)
    x[:3] = np.array([0.5, 1.5, -2.5], np.float32) * np.float32(0.04)
    a, b = rng.standard_normal((2, n)).astype(np.float32)
    M, d = 5, 577
    xr, g = rng.standard_normal((M, d)).astype(np.float32), rng.standard_normal(d).astype(np.float32)
    T, H, hd = 7, 3, 18
    xq = rng.standard_normal((T, H, hd)).astype(np.float32)
    cos, sin = rope_tables(T, hd, 10000.0)
    gg, u = (rng.standard_normal(n) * 6).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    acc = rng.integers(-2 ** 31, 2 ** 31, (3, 65)).astype(np.int32)
    ws = (rng.random(65) * 1e-2).astype(np.float32)
    cap, past, m, Hq, KV, hdd = 30, 20, 5, 6, 2, 20
    q = rng.standard_normal((m, Hq, hdd)).astype(np.float32)
    kc, vc = rng.standard_normal((2, cap, KV, hdd)).astype(np.float32)
    cases = [(6, [n, f32bits(0.04)], x.tobytes()),
             (7, [M, d, f32bits(1e-5)], xr.tobytes() + g.tobytes()),
             (8, [T, H, hd], xq.tobytes() + cos.tobytes() + sin.tobytes()),
             (9, [cap, past, m, Hq, KV, hdd], q.tobytes() + kc.tobytes() + vc.tobytes()),
             (10, [n], gg.tobytes() + u.tobytes()),
             (11, [3, 65, f32bits(0.0173)], acc.tobytes() + ws.tobytes()),
             (12, [n], a.tobytes() + b.tobytes())]
    res = run(harness, cases)
    for isa in ISAS:
        got = [np.frombuffer(r[isa][1], np.int8 if k == 0 else np.float32) for k, r in enumerate(res)]
        assert all(r[isa][0] == 0 for r in res), isa
        assert np.array_equal(got[0], R.quantize_i8(x, 0.04)), isa
        close(got[1].reshape(M, d), R.rmsnorm(xr, g, 1e-5), R.RMSNORM_RTOL, R.RMSNORM_ATOL)
        assert np.array_equal(got[2].reshape(T, H, hd), R.rope(xq, cos, sin)), isa
        close(got[3].reshape(m, Hq * hdd), R.attention(q, kc, vc, past), R.ATTENTION_RTOL, R.ATTENTION_ATOL)
        close(got[4], R.silu_mul(gg, u), R.SILU_RTOL, R.SILU_ATOL)
        assert np.array_equal(got[5].reshape(3, 65), R.dequant_i32(acc, 0.0173, ws)), isa
        assert np.array_equal(got[6][:n], R.add(a, b)) and got[6][n] == R.absmax(a), isa
