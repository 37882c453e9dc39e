"""Shared test vectors, the force-one-ISA fixture and the aarch64 harness for the native kernel tests (SimSIMD
style)."""
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import native


def random_codes(rng: np.random.Generator, bits: np.ndarray, D: int) -> np.ndarray:
    """(C,) bits -> q int8 (C, D) uniform over each channel's full signed range, extremes included."""
    C = bits.size
    lo = -(1 << (bits.astype(np.int64) - 1))
    hi = (1 << (bits.astype(np.int64) - 1)) - 1
    q = rng.integers(lo[:, None], hi[:, None] + 1, size=(C, D))
    if C and D >= 2:
        q[:, 0], q[:, -1] = lo, hi                     # both range ends in every channel
    return q.astype(np.int8)


@pytest.fixture(params=native.available_isas())
def isa(request):
    """Every ISA this machine runs, one at a time, forced globally for the duration of the test."""
    with native.force_isa(request.param):
        yield request.param


ROOT = Path(__file__).resolve().parents[2]
CC, QEMU = "aarch64-linux-gnu-gcc", "qemu-aarch64"


@pytest.fixture(scope="session")
def harness(tmp_path_factory):
    """native/harness/ef_harness.c and every native/src/*.c, cross-compiled statically for aarch64 once per session
    (run under qemu-aarch64); without the cross tools the NEON tests skip and say how to get them."""
    missing = [t for t in (CC, QEMU) if shutil.which(t) is None]
    if missing:
        pytest.skip(f"NEON tests need {' and '.join(missing)} (Debian: apt-get install gcc-aarch64-linux-gnu "
                    f"qemu-user; `make cross-tools` does it)")
    d = tmp_path_factory.mktemp("neon")
    exe = d / "ef_harness"
    srcs = sorted(str(p) for p in (ROOT / "native" / "src").glob("*.c"))
    cmd = [CC, "-O2", "-std=c11", "-static", "-Wall", "-I", str(ROOT / "native" / "src"), *srcs,
           str(ROOT / "native" / "harness" / "ef_harness.c"), "-o", str(exe)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"cross-compile failed: {r.stderr[-2000:]}"
    return exe
