"""NEON kernels, cross-compiled for aarch64 and run under qemu-aarch64, checked bit-exactly against the NumPy
reference (docs/design.md §6: the aarch64 NEON kernels are cross-compiled here and run under qemu-aarch64).

The harness (native/harness/ef_harness.c) is compiled statically into a temp dir once per session; without
`aarch64-linux-gnu-gcc` or `qemu-aarch64` the tests skip and say how to get them (`make cross-tools`).
"""
import struct
import subprocess
from pathlib import Path

import numpy as np

from quant.pack import baselines, pack_bits3, weightlet, write_packed_model
from tests.native.conftest import random_codes

ROOT = Path(__file__).resolve().parents[2]
CC, QEMU = "aarch64-linux-gnu-gcc", "qemu-aarch64"
KIND = {"weightlet": 0, "mixed": 1, "kquant": 2, "container": 3}


def run_cases(exe: Path, cases: list[tuple[str, int, int, int, bytes, bytes]]) -> bytes:
    d = exe.parent
    buf = [struct.pack("<I", len(cases))]
    for kind, R, C, D, b3, pl in cases:
        buf += [struct.pack("<IIQQQ", KIND[kind], R, C, D, len(b3)), b3, struct.pack("<Q", len(pl)), pl]
    (d / "in.bin").write_bytes(b"".join(buf))
    r = subprocess.run([QEMU, str(exe), str(d / "in.bin"), str(d / "out.bin"), "ref,neon"], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, f"harness failed ({r.returncode}): {r.stderr}"
    return (d / "out.bin").read_bytes()


def test_neon_unpack_bit_exact(harness):
    rng = np.random.default_rng(42)
    cases, want = [], []
    for R in weightlet.GROUPS:
        for B in range(1, 9):
            bits = np.full(3, B)
            q = random_codes(rng, bits, 2 * R + 17)
            cases.append(("weightlet", R, 3, q.shape[1], pack_bits3(bits).tobytes(),
                          weightlet.pack(q, bits, R).tobytes()))
            want.append(q)
        bits = rng.integers(1, 9, 21)                                   # mixed widths, odd length
        q = random_codes(rng, bits, 333)
        cases.append(("weightlet", R, 21, 333, pack_bits3(bits).tobytes(), weightlet.pack(q, bits, R).tobytes()))
        want.append(q)
    bits = rng.integers(1, 9, 19)
    q = random_codes(rng, bits, 577)
    for kind, pk in (("mixed", baselines.mixed_pack), ("kquant", baselines.kquant_pack)):
        cases.append((kind, 0, 19, 577, pack_bits3(bits).tobytes(), pk(q, bits).tobytes()))
        want.append(q)
    cases.append(("weightlet", 128, 0, 50, b"", b""))                   # zero channels
    want.append(np.zeros((0, 50), np.int8))
    out, at = run_cases(harness, cases), 0
    for (kind, R, C, D, _, _), q in zip(cases, want):
        for isa in ("ref", "neon"):
            rc = struct.unpack_from("<i", out, at)[0]
            got = np.frombuffer(out, np.int8, C * D, at + 4).reshape(C, D)
            at += 4 + C * D
            assert rc == 0 and np.array_equal(got, q), (kind, R, C, D, isa)
    assert at == len(out)


def test_neon_build_container_reader(harness, tmp_path):
    rng = np.random.default_rng(3)
    bits = rng.integers(1, 9, 10)
    q = random_codes(rng, bits, 100)
    good = write_packed_model(tmp_path / "m.efp", {"w": (q, bits, np.ones(10, np.float32))}).read_bytes()
    bad = bytearray(good)
    bad[4096 + 200] ^= 0x04
    cases = [("container", 0, 0, 0, b"", good), ("container", 0, 0, 0, b"", bytes(bad)),
             ("container", 0, 0, 0, b"", good[:len(good) - 10])]
    out = run_cases(harness, cases)
    res = [struct.unpack_from("<iI", out, k * 264) + (out[k * 264 + 8:(k + 1) * 264].rstrip(b"\0").decode(),)
           for k in range(3)]
    import zlib
    assert res[0][0] == 0 and res[0][1] == zlib.crc32(good)
    assert res[1][0] == -7 and "tensor 'w' (#0) at offset 4096: checksum mismatch" in res[1][2]
    assert res[2][0] == -2 and "truncated" in res[2][2]
