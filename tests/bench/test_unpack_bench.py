"""Unpack throughput of the packed formats, side by side in one run (EdgeFlow §4.2, Fig. 4b / 13;
docs/packing.md).

A Llama3-8B ffn_down-sized tensor (4096 out channels x 14336 weights) with the twin bit allocation of Llama3-8B
at a 5-bit budget (quant.twin.twin_bits, layer 0; falls back to the Fig. 4a shares without the twin), random codes.
Single thread (plus one 2-thread row for the best ISA and memcpy). Per format and ISA: best-of-N wall time (the
configurations are timed round-robin, N rounds, so interference from other work hits all alike) of the native unpack
into a warm (C, D) int8 buffer -> weights/s, GB/s of INT8 output, ratio to memcpy of the same INT8 bytes (the physical
limit, measured in this run), and instructions per weight counted with valgrind's callgrind on
a strided channel slice (`perf stat` has no instruction counter on this host; valgrind cannot run AVX-512, so that
column is n/a there).
Also the per-bit-width unpack throughput (all channels at B bits) that the cold-start simulator consumes.
A second run uses the EdgeFlow Fig. 4a channel shares instead of the twin.
With the `peer` extra installed (llama-cpp-python), the twin run adds llama.cpp's own K-quant dequantization (ggml's
`dequantize_row_q4_K/q5_K/q6_K` via hil.peer, the ISA the extra was built for, float32 output as ggml produces it) of
the same number of weights, quantized from Gaussian weights with ggml's `quantize_row_*_ref`: the real peer beside the
scalar K-quant-like baseline (`kquant`), same timing loop; × memcpy is against the INT8 memcpy of the same weights.
Prints tables and writes outputs/bench/unpack.json (twin, with the per-bit table) and unpack_fig4a.json
(every number is measured).
"""
from __future__ import annotations

import os
import platform
import shutil
import struct
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

import native
from quant.atomic import atomic_write_json
from quant.pack import baselines, pack_bits3, weightlet
from quant.pack.formats import FORMATS

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "outputs" / "bench" / "unpack.json"
C, D = 4096, 14336                  # Llama3-8B ffn_down (out channels, weights per channel)
BUDGET = 5.0                        # bits per weight (EdgeFlow's 5-bit setting)
FIG4A = {4: 0.115, 5: 0.777, 6: 0.099, 7: 0.008, 8: 0.0004}  # EdgeFlow Fig. 4a channel shares
REPS = 15                           # timed repetitions (best-of, round-robin) per configuration
COUNT_STRIDE = 32                   # every 32nd channel for the callgrind instruction counts (128 x 14336 weights)
PER_BIT_SHAPE = (512, 4096)         # per-bit-width throughput tensor
GGML_KINDS = ("q4_K", "q5_K", "q6_K")   # llama.cpp K-quants (ggml's dequantize_row_*), with the peer extra only
GGML_CHECK_ROWS = 16                # rows of each ggml output checked against gguf-py's NumPy dequantizer


def ggml_blocks(seed: int = 0) -> tuple[dict[str, np.ndarray], str]:
    """({kind: ggml blocks of C x D Gaussian weights}, note); empty without the peer extra (note says how to add it)."""
    from hil import peer

    if not peer.available():
        return {}, peer.INSTALL_HINT
    x = np.random.default_rng(seed).standard_normal(C * D, dtype=np.float32)      # (C·D,) weights
    out = {k: peer.ggml_quantize_ref(k, x) for k in GGML_KINDS}
    return out, f"llama.cpp {peer.peer_version()} libggml dequantize_row_<kind>, float32 out, 1 thread"


def fig4a_bits(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    p = np.array(list(FIG4A.values()))
    return rng.choice(list(FIG4A), size=C, p=p / p.sum())


def allocation(seed: int = 0) -> tuple[np.ndarray, str]:
    try:
        from quant.arch import model_spec
        from quant.twin import twin_bits

        b = twin_bits(model_spec("llama3_8b"), BUDGET, seed=seed)["ffn_down"][:C]
        return np.asarray(b, dtype=np.int64), "twin of Llama3-8B, ffn_down layer 0, 5.0-bit budget"
    except Exception as e:  # the twin is another module's; say which allocation was used
        return fig4a_bits(seed), f"Fig. 4a shares (twin unavailable: {e})"


def codes(bits: np.ndarray, D: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    lo = -(1 << (bits - 1))
    return rng.integers(lo[:, None], -lo[:, None], size=(bits.size, D)).astype(np.int8)


def best_time(fn, reps: int = REPS) -> tuple[float, float]:
    fn()                                                    # warm: page-in output and input
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return min(ts), float(np.median(ts))


# ---- callgrind instruction counts -------------------------------------------------------------------------------
KIND = {"weightlet": 0, "mixed": 1, "kquant": 2, "int8": 4}
TOGGLE = {"weightlet": "ef_unpack_weightlet", "mixed": "ef_unpack_mixed", "kquant": "ef_unpack_kquant",
          "int8": "ef_unpack_int8"}


def build_harness(d: Path) -> Path | None:
    if shutil.which("gcc") is None or shutil.which("valgrind") is None:
        return None
    exe = d / "ef_harness"
    srcs = sorted(str(p) for p in (ROOT / "native" / "src").glob("*.c"))
    r = subprocess.run(["gcc", "-O3", "-std=c11", "-fno-strict-aliasing", "-I", str(ROOT / "native" / "src"), *srcs,
                        str(ROOT / "native" / "harness" / "ef_harness.c"), "-o", str(exe)], capture_output=True,
                       text=True, timeout=300)
    return exe if r.returncode == 0 else None


def count_instructions(exe: Path, d: Path, fmt: str, isa: str, R: int, b3: bytes, payload: bytes,
                       Cs: int, Ds: int) -> float | None:
    (d / "in.bin").write_bytes(struct.pack("<IIIQQQ", 1, KIND[fmt], R, Cs, Ds, len(b3)) + b3 +
                               struct.pack("<Q", len(payload)) + payload)
    cg = d / "cg.out"
    r = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={cg}", "--collect-atstart=no",
                        f"--toggle-collect={TOGGLE[fmt]}", str(exe), str(d / "in.bin"), str(d / "out.bin"), isa],
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0 or not cg.exists():
        return None                                         # e.g. AVX-512 is not available under valgrind
    for line in cg.read_text().splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1]) / (Cs * Ds)
    return None


def _payloads(q: np.ndarray, bits: np.ndarray, twin: bool) -> tuple[dict, str]:
    """Every format's packed tensor, keyed (format, group); ggml's K-quant blocks on the twin run (peer extra)."""
    payloads = {("weightlet", R): weightlet.pack(q, bits, R) for R in weightlet.GROUPS}
    payloads[("mixed", 0)] = baselines.mixed_pack(q, bits)
    payloads[("kquant", 0)] = baselines.kquant_pack(q, bits)
    payloads[("int8", 0)] = baselines.int8_pack(q, bits)
    ggml, ggml_note = ggml_blocks() if twin else ({}, "twin run only")
    for k, blk in ggml.items():
        payloads[(f"ggml_{k}", 0)] = blk
    return payloads, ggml_note


def _configs(isas: list[str], payloads: dict) -> list[tuple[str, int, str]]:
    """(format, group, isa) of every timed kernel: memcpy first (the baseline), every ISA of each format."""
    configs = [("memcpy", 0, "libc")]
    configs += [("weightlet", 128, i) for i in isas]
    configs += [("weightlet", 256, i) for i in isas if i in ("avx2", "avx512", "neon")]
    configs += [("weightlet", 512, i) for i in isas if i in ("avx512",)]
    configs += [("mixed", 0, i) for i in isas]
    configs += [("kquant", 0, "ref"), ("int8", 0, "libc")]
    configs += [(f, 0, "ggml") for f, _ in payloads if f.startswith("ggml_")]
    return configs


def _make_call(fmt, R, isa, payloads, b3, out, src8, out_f32):
    if fmt == "memcpy":
        return lambda: native.memcpy(out, src8)
    if fmt.startswith("ggml_"):
        from hil import peer

        blk = payloads[(fmt, R)]
        return lambda: peer.ggml_dequant(fmt[5:], blk, C * D, out=out_f32)
    p, f = payloads[(fmt, R)], FORMATS[fmt]
    if isa == "libc":
        return lambda: f.unpack_native(p, b3, C, D, R, out=out)
    return lambda: f.unpack_native(p, b3, C, D, R, isa=isa, out=out)


def _check_kernels(configs, calls, payloads, q, out, out_f32) -> None:
    """Warm every kernel up and check its output before it is timed (a benchmark of a wrong kernel is worthless);
    ggml's C kernel against gguf-py's NumPy codec on its first rows."""
    for c, call in zip(configs, calls):
        call()
        if c[0].startswith("ggml_"):
            import gguf

            n_chk = GGML_CHECK_ROWS * D
            blk = payloads[(c[0], 0)][:len(payloads[(c[0], 0)]) * n_chk // (C * D)]
            ref = gguf.quants.dequantize(blk, getattr(gguf.GGMLQuantizationType, c[0][5:].upper())).reshape(-1)
            np.testing.assert_allclose(out_f32[:n_chk], ref, rtol=1e-6, atol=1e-7, err_msg=c[0])
            continue
        assert c[0] == "memcpy" or np.array_equal(out, q), c


def _round_robin(configs, calls) -> list[dict]:
    """Best and median of REPS timings per config, the configs taken in turn (interference from other work on this
    shared host hits every config alike)."""
    times = [[] for _ in configs]
    for _ in range(REPS):
        for k, call in enumerate(calls):
            t0 = time.perf_counter()
            call()
            times[k].append(time.perf_counter() - t0)
    return [dict(format=f, group=R, isa=i, s=min(ts), s_median=float(np.median(ts)))
            for (f, R, i), ts in zip(configs, times)]


def _two_thread_rows(payloads, b3, q, out, src8) -> list[dict]:
    """Weightlet R=128 and memcpy on two threads (channel halves in parallel; this host has 2 shared cores, so
    indicative)."""
    from concurrent.futures import ThreadPoolExecutor

    best_isa = native.best_isa()
    pw = payloads[("weightlet", 128)]
    t, tm = best_time(lambda: native.unpack_weightlet(pw, b3, C, D, 128, isa=best_isa, out=out, threads=2))
    assert np.array_equal(out, q)
    rows = [dict(format="weightlet", group=128, isa=best_isa, threads=2, s=t, s_median=tm)]
    with ThreadPoolExecutor(2) as ex:
        halves = ((0, C // 2 * D), (C // 2 * D, C * D))
        t, tm = best_time(lambda: list(ex.map(lambda r: native.memcpy(out.reshape(-1)[r[0]:r[1]],
                                                                      src8.reshape(-1)[r[0]:r[1]]), halves)))
    rows.append(dict(format="memcpy", group=0, isa="libc", threads=2, s=t, s_median=tm))
    return rows


def _count_instructions(rows: list[dict], bits: np.ndarray, q: np.ndarray) -> None:
    """rows' `instr_per_weight` (callgrind) on a strided channel slice with the same bit mix; None where not
    counted (memcpy / int8: glibc's `rep movsb` counts bytes; ggml: its library, not our harness; 2 threads)."""
    with tempfile.TemporaryDirectory() as td:
        d = Path(td)
        exe = build_harness(d)
        sb = bits[::COUNT_STRIDE]
        sq = q[::COUNT_STRIDE]
        sb3 = pack_bits3(sb).tobytes()
        spay = {("weightlet", R): weightlet.pack(sq, sb, R).tobytes() for R in weightlet.GROUPS}
        spay[("mixed", 0)] = baselines.mixed_pack(sq, sb).tobytes()
        spay[("kquant", 0)] = baselines.kquant_pack(sq, sb).tobytes()
        spay[("int8", 0)] = baselines.int8_pack(sq, sb).tobytes()
        for r in rows:
            r["instr_per_weight"] = None
            if exe is None or r["format"] in ("memcpy", "int8") or r.get("threads", 1) != 1 \
                    or r["format"].startswith("ggml_"):
                continue
            isa = "ref" if r["isa"] == "libc" else r["isa"]
            r["instr_per_weight"] = count_instructions(exe, d, r["format"], isa, r["group"], sb3,
                                                       spay[(r["format"], r["group"])], sb.size, D)


def _per_bit(isas: list[str], twin: bool) -> tuple[list[dict], float]:
    """Per-bit-width throughput (cold-start simulator input): every channel of a PER_BIT_SHAPE tensor at B bits,
    weightlet per ISA, mixed at the best ISA, kquant's scalar reference (twin run only); and the memcpy rate of the
    same INT8 tensor (its cache-resident limit)."""
    per_bit = []
    Cb, Db = PER_BIT_SHAPE
    ob = np.empty((Cb, Db), dtype=np.int8)
    small = np.ones((Cb, Db), dtype=np.int8)
    t_small, _ = best_time(lambda: native.memcpy(ob, small))              # cache-resident limit (2 MiB)
    for B in range(1, 9) if twin else ():
        bb = np.full(Cb, B)
        qb = codes(bb, Db, seed=B)
        pb, b3b = weightlet.pack(qb, bb, 128), pack_bits3(bb)
        for isa in isas:
            t, _ = best_time(lambda: native.unpack_weightlet(pb, b3b, Cb, Db, 128, isa=isa, out=ob))
            assert np.array_equal(ob, qb)
            per_bit.append(dict(bits=B, isa=isa, group=128, weights_per_s=Cb * Db / t))  # weightlet
        pm = baselines.mixed_pack(qb, bb)
        t, _ = best_time(lambda: native.unpack_mixed(pm, b3b, Cb, Db, isa=native.best_isa(), out=ob))
        assert np.array_equal(ob, qb)
        per_bit.append(dict(bits=B, isa=native.best_isa(), group=0, format="mixed", weights_per_s=Cb * Db / t))
        pk = baselines.kquant_pack(qb, bb)
        t, _ = best_time(lambda: native.unpack_kquant(pk, b3b, Cb, Db, isa="ref", out=ob), 3)
        per_bit.append(dict(bits=B, isa="ref", group=0, format="kquant", weights_per_s=Cb * Db / t))
    return per_bit, Cb * Db / t_small


def _derive(rows: list[dict], payloads: dict) -> None:
    """Throughput, memcpy ratio (same thread count), packed bytes and output type of every row."""
    n = C * D
    t_memcpy = rows[0]["s"]
    t_memcpy2 = [r["s"] for r in rows if r["format"] == "memcpy" and r.get("threads") == 2][0]
    for r in rows:
        r.setdefault("threads", 1)
        r["weights_per_s"] = n / r["s"]
        r["gb_per_s_int8_out"] = n / r["s"] / 1e9
        r["ratio_to_memcpy"] = (t_memcpy if r["threads"] == 1 else t_memcpy2) / r["s"]
        p = payloads.get((r["format"], r["group"]))
        r["packed_bytes"] = int(p.size) if p is not None else n
        r["out"] = "float32" if r["format"].startswith("ggml_") else "int8"


def _report(rows, per_bit, memcpy_small, bits, alloc_src, ggml_note, twin, out_json) -> None:
    Cb, Db = PER_BIT_SHAPE
    print(f"\nunpack of a {C}x{D} tensor ({alloc_src}; mean {bits.mean():.3f} bits), best of {REPS}")
    print(f"{'format':10s} {'R':>4s} {'isa':7s} {'thr':>3s} {'MB packed':>9s} {'ms':>8s} {'Gweights/s':>10s} "
          f"{'GB/s out':>8s} {'x memcpy':>8s} {'instr/w':>7s}")
    for r in rows:
        ipw = "n/a" if r["instr_per_weight"] is None else f"{r['instr_per_weight']:.3f}"
        print(f"{r['format']:10s} {r['group']:4d} {r['isa']:7s} {r['threads']:3d} {r['packed_bytes'] / 1e6:9.1f} "
              f"{r['s'] * 1e3:8.2f} {r['weights_per_s'] / 1e9:10.2f} {r['gb_per_s_int8_out']:8.2f} "
              f"{r['ratio_to_memcpy']:8.3f} {ipw:>7s}")
    print(f"per bit width, weightlet R=128, {Cb}x{Db} (Gweights/s; memcpy of the same int8 "
          f"{memcpy_small / 1e9:.2f}):" if per_bit else "")
    for B in range(1, 9) if per_bit else ():
        cells = " ".join(f"{x['isa']}={x['weights_per_s'] / 1e9:.2f}" for x in per_bit
                         if x["bits"] == B and "format" not in x)
        mx = [x for x in per_bit if x["bits"] == B and x.get("format") == "mixed"][0]["weights_per_s"]
        cells += f"  mixed-{native.best_isa()}={mx / 1e9:.2f}"
        kq = [x for x in per_bit if x["bits"] == B and x.get("format") == "kquant"][0]["weights_per_s"]
        print(f"  B={B}: {cells}  kquant-ref={kq / 1e9:.3f}")
    best1 = max((r for r in rows if r["format"] == "weightlet" and r["threads"] == 1), key=lambda r: r["weights_per_s"])
    for r in rows:
        if r["format"].startswith("ggml_") or r["format"] == "kquant":
            print(f"  x {r['format']}: best weightlet ({best1['isa']}, R={best1['group']}) is "
                  f"{best1['weights_per_s'] / r['weights_per_s']:.2f}x its throughput")
    if twin and not any(r["format"].startswith("ggml_") for r in rows):
        print(f"  (no llama.cpp K-quant rows: {ggml_note})")
    print(f"wrote {out_json}")


@pytest.mark.bench
@pytest.mark.parametrize("alloc", ["twin", "fig4a"])
def test_unpack_throughput(alloc):
    twin = alloc == "twin"
    bits, alloc_src = allocation() if twin else (fig4a_bits(), "EdgeFlow Fig. 4a channel shares")
    out_json = OUT if twin else OUT.with_name("unpack_fig4a.json")
    q = codes(bits, D)
    b3 = pack_bits3(bits)
    out = np.empty((C, D), dtype=np.int8)
    isas = native.available_isas()
    payloads, ggml_note = _payloads(q, bits, twin)
    has_ggml = any(f.startswith("ggml_") for f, _ in payloads)
    out_f32 = np.empty(C * D, dtype=np.float32) if has_ggml else None     # ggml dequantizes to float32
    src8 = q.copy()
    configs = _configs(isas, payloads)
    calls = [_make_call(*c, payloads, b3, out, src8, out_f32) for c in configs]
    _check_kernels(configs, calls, payloads, q, out, out_f32)
    rows = _round_robin(configs, calls) + _two_thread_rows(payloads, b3, q, out, src8)
    _count_instructions(rows, bits, q)
    per_bit, memcpy_small = _per_bit(isas, twin)
    _derive(rows, payloads)
    hist = {int(b): float(np.mean(bits == b)) for b in range(1, 9) if np.any(bits == b)}
    atomic_write_json(out_json, dict(
        measured=True, host=platform.processor() or platform.machine(), cpu_count=os.cpu_count(), threads=1,
        tensor=dict(C=C, D=D, weights=C * D, allocation=alloc_src, bits_share=hist, mean_bits=float(bits.mean())),
        ggml=ggml_note,
        reps=REPS, timing="best of reps, round-robin over configs, warm buffers; threads=1 unless a row says 2",
        isas=isas,
        instr_counter="valgrind callgrind (perf stat: instructions not supported on this host)",
        rows=rows, per_bit=per_bit, per_bit_shape=list(PER_BIT_SHAPE),
        per_bit_memcpy_weights_per_s=memcpy_small))
    _report(rows, per_bit, memcpy_small, bits, alloc_src, ggml_note, twin, out_json)
    best = max((r for r in rows if r["format"] == "weightlet" and r["threads"] == 1), key=lambda r: r["weights_per_s"])
    kq = [r for r in rows if r["format"] == "kquant"][0]
    assert best["weights_per_s"] > kq["weights_per_s"]   # the comparison the paper makes; fails loudly if not
