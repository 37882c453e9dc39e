"""INT8 GEMM / GEMV throughput of the native compute kernels (native/compute.py; EdgeFlow paper §4.1 W8A8 linears
on the NPU stand-in of the host runner; docs/hil.md "Native compute kernels").

Shapes: the linear layers of SmolLM2-135M (d 576, ffn 1536: K x N = 576 x 1536 and 1536 x 576) and of a 1B Llama
(2048 x 8192, 8192 x 2048), M = 1, 16, 64, 128 prompt rows. Per shape, every compute ISA on one thread, the best ISA
on two threads (columns split over two Python threads; ctypes releases the GIL), and in the same run two NumPy
baselines: int32 matmul of the same integers (NumPy's integer matmul, one thread, timed once: it is slow) and
float32 matmul (BLAS, its own threads). GOP/s counts 2 * M * K * N; ratios are to the baselines of the same run.
GEMV (M = 1) of the tied LM head (49152 x 576): weight bytes streamed per second vs memcpy of the same bytes.
Best-of-N wall time, configurations interleaved round-robin so interference from other work hits all alike; the
results are checked against the exact reference first. Prints tables, writes outputs/bench/compute.json (every
number measured).
"""
from __future__ import annotations

import os
import platform
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import native
from native import compute as C
from quant.atomic import atomic_write_json

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "outputs" / "bench" / "compute.json"
SHAPES = {"smollm2_135m": ((576, 1536), (1536, 576)), "llama_1b": ((2048, 8192), (8192, 2048))}   # (K, N)
ROWS = (1, 16, 64, 128)        # M: prompt rows per GEMM
HEAD = (49152, 576)            # SmolLM2 tied LM head (N, K), the GEMV
REPS = 5                       # best-of rounds


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def best_of(calls: dict, reps: int = REPS) -> dict[str, float]:
    """Best wall time of each call, rounds interleaved (call order rotated each round)."""
    for f in calls.values():
        f()                                                     # warm
    best = {k: float("inf") for k in calls}
    keys = list(calls)
    for r in range(reps):
        for k in keys[r % len(keys):] + keys[:r % len(keys)]:
            best[k] = min(best[k], timed(calls[k]))
    return best


def two_threads(x, w, out, isa):
    N = w.shape[0]
    half = N // 2 // 4 * 4
    ts = [threading.Thread(target=C.gemm_i8_i32, args=(x, w), kwargs=dict(out=out, n0=a, n1=b, isa=isa))
          for a, b in ((0, half), (half, N))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


@pytest.mark.bench
def test_gemm_throughput():
    rng = np.random.default_rng(0)
    isas = native.available_compute_isas()
    best = C.best_compute_isa()
    rows, table = [], []
    for model, shapes in SHAPES.items():
        for K, N in shapes:
            w = rng.integers(-128, 128, (N, K)).astype(np.int8)
            wf, wi = w.astype(np.float32), w.astype(np.int32)
            for M in ROWS:
                x = rng.integers(-127, 128, (M, K)).astype(np.int8)
                xf, xi = x.astype(np.float32), x.astype(np.int32)
                want = xi @ wi.T
                out = np.zeros((M, N), np.int32)
                calls = {}
                for isa in isas:
                    if isa == "ref" and M * K * N > 64 * 576 * 1536:
                        continue                                  # scalar reference: only the small shapes
                    calls[isa] = (lambda i=isa: C.gemm_i8_i32(x, w, out=out, isa=i))
                calls[f"{best} x2"] = lambda: two_threads(x, w, out, best)
                calls["numpy f32"] = lambda: xf @ wf.T
                for k in [k for k in calls if not k.startswith("numpy")]:
                    out[:] = 0
                    calls[k]()
                    assert np.array_equal(out, want), (k, M, K, N)   # a benchmark of a wrong kernel is worthless
                t = best_of(calls)
                t["numpy i32"] = timed(lambda: xi @ wi.T)           # one run: NumPy's integer matmul is slow
                ops = 2.0 * M * K * N
                gops = {k: ops / v / 1e9 for k, v in t.items()}
                rows.append(dict(model=model, M=M, K=K, N=N, gops=gops,
                                 x_numpy_i32={k: gops[k] / gops["numpy i32"] for k in gops},
                                 x_numpy_f32={k: gops[k] / gops["numpy f32"] for k in gops}))
                table.append((model, M, K, N, gops))
    cols = [c for c in table[0][4]]
    print(f"\nINT8 GEMM, GOP/s (measured; 2*M*K*N ops; '{best} x2' = 2 threads, columns split; GEMM kernel of each "
          f"level: {', '.join(f'{i}={C.gemm_variant(i)}' for i in isas)})")
    print(f"{'model':13s} {'M':>4s} {'K':>5s} {'N':>5s} " + " ".join(f"{c:>10s}" for c in cols)
          + f" {'best/i32':>9s} {'best/f32':>9s}")
    for model, M, K, N, g in table:
        print(f"{model:13s} {M:4d} {K:5d} {N:5d} " + " ".join(f"{g.get(c, float('nan')):10.1f}" for c in cols)
              + f" {g[best] / g['numpy i32']:9.1f} {g[best] / g['numpy f32']:9.2f}")

    # ---- GEMV: the LM head streams 28 MB of INT8 weights per token ----
    Nh, Kh = HEAD
    w = rng.integers(-128, 128, (Nh, Kh)).astype(np.int8)
    x = rng.integers(-127, 128, (1, Kh)).astype(np.int8)
    out = np.zeros((1, Nh), np.int32)
    want = x.astype(np.int32) @ w.astype(np.int32).T
    dst = np.empty_like(w)
    calls = {isa: (lambda i=isa: C.gemm_i8_i32(x, w, out=out, isa=i)) for isa in isas if isa != "ref"}
    calls[f"{best} x2"] = lambda: two_threads(x, w, out, best)
    calls["memcpy"] = lambda: native.memcpy(dst, w)
    for k in [k for k in calls if k != "memcpy"]:
        out[:] = 0
        calls[k]()
        assert np.array_equal(out, want), k
    t = best_of(calls, reps=2 * REPS)
    gemv = {k: dict(gbps=w.nbytes / v / 1e9, x_memcpy=t["memcpy"] / v) for k, v in t.items()}
    print(f"\nGEMV {Nh}x{Kh} (LM head, M = 1), weight GB/s (measured) and time ratio to memcpy of the same bytes")
    for k, v in gemv.items():
        print(f"  {k:12s} {v['gbps']:7.2f} GB/s   x memcpy {v['x_memcpy']:.2f}")
    atomic_write_json(OUT, dict(
        what="INT8 GEMM / GEMV throughput of native/compute.py (measured)",
        host=dict(machine=platform.machine(), processor=platform.processor(), cpus=os.cpu_count()),
        isas=isas, gemm_variant={i: C.gemm_variant(i) for i in isas}, best=best, reps=REPS,
        gemm=rows, gemv=dict(N=Nh, K=Kh, results=gemv), measured_keys=["gemm", "gemv"]))
    print(f"wrote {OUT}")


@pytest.mark.bench
def test_operand_alignment():
    """Why the runner and the calibration put every kernel operand on a cache line (native.compute.aligned,
    docs/hil.md "Operand alignment"): the same GEMM (SmolLM2 FFN, 128 x 576 x 1536) and attention (128 tokens, 9 / 3
    heads of 64) with their inputs 64-byte aligned and at +16 B (malloc's alignment), interleaved best-of; results
    checked equal. Ratios of the same run (measured); writes outputs/bench/alignment.json."""
    rng = np.random.default_rng(1)
    M, K, N = 128, 576, 1536
    x = rng.integers(-127, 128, (M, K)).astype(np.int8)
    w = rng.integers(-128, 128, (N, K)).astype(np.int8)
    q = rng.standard_normal((M, 9, 64)).astype(np.float32)
    kc = rng.standard_normal((M, 3, 64)).astype(np.float32)
    vc = rng.standard_normal((M, 3, 64)).astype(np.float32)
    outs = {}
    calls = {}
    for off in (0, 16):
        xa, wa = C.aligned_copy(x, offset=off), C.aligned_copy(w, offset=off)
        oa = C.aligned((M, N), np.int32, offset=off)
        qa, ka, va = (C.aligned_copy(a, offset=off) for a in (q, kc, vc))
        ao = C.aligned((M, 576), np.float32, offset=off)
        outs[off] = (oa, ao)
        calls[f"gemm +{off}"] = lambda xa=xa, wa=wa, oa=oa: C.gemm_i8_i32(xa, wa, out=oa)
        calls[f"attention +{off}"] = lambda qa=qa, ka=ka, va=va, ao=ao: C.attention(qa, ka, va, 0, out=ao)
    t = best_of(calls, reps=4 * REPS)
    assert np.array_equal(outs[0][0], outs[16][0]) and np.array_equal(outs[0][1], outs[16][1])
    assert all(a.ctypes.data % C.SIMD_ALIGN == 0 for a in (C.aligned((3, 5), np.int8), C.aligned_copy(x)))
    res = {k: dict(us=v * 1e6) for k, v in t.items()}
    print(f"\noperand alignment ({C.best_compute_isa()}; best-of wall time, measured)")
    for kind in ("gemm", "attention"):
        a, u = t[f"{kind} +0"], t[f"{kind} +16"]
        res[kind] = dict(aligned_us=a * 1e6, misaligned_us=u * 1e6, misaligned_x_aligned=u / a)
        print(f"  {kind:10s} 64-B aligned {a * 1e6:8.1f} us   at +16 B {u * 1e6:8.1f} us   x{u / a:.2f}")
    atomic_write_json(OUT.parent / "alignment.json", dict(
        what="kernel time with operands 64-byte aligned vs at +16 B (measured)", isa=C.best_compute_isa(),
        results=res, measured_keys=["results"]))
