"""quant.ggml_blocks: the NumPy Q4_K quantizer is bit-exact with ggml's quantize_row_q4_K_ref (llama-cpp-python's
libggml, when installed), its blocks are ggml's layout (gguf-py dequantizes them to our own dequantization), Q8_0 is
ggml's, and the padding / block-shift wrappers keep the format's mechanics."""
from __future__ import annotations

import ctypes
import importlib.util
from pathlib import Path

import numpy as np
import pytest

from quant.ggml_blocks import (
    Q4_K_BYTES,
    dequantize_q4_k,
    q4_k_roundtrip,
    q8_0_roundtrip,
    quantize_q4_k,
)
from tests.quant.conftest import needs_model


def _libggml():
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        return None
    p = Path(spec.origin).parent / "lib" / "libggml-base.so"
    if not p.is_file():
        return None
    lib = ctypes.CDLL(str(p))
    for name in ("quantize_row_q4_K_ref", "quantize_row_q8_0_ref"):
        f = getattr(lib, name)
        f.restype, f.argtypes = None, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    return lib


LIB = _libggml()
needs_ggml = pytest.mark.skipif(LIB is None, reason="llama-cpp-python's libggml-base.so not installed")


def _cases():
    rng = np.random.default_rng(7)
    return {
        "normal": rng.normal(size=256 * 24),
        "heavy_tailed": rng.standard_t(3, size=256 * 24) * 0.02,
        "all_positive": np.abs(rng.normal(size=256 * 8)),
        "zero_blocks": np.concatenate([np.zeros(256 + 64), rng.normal(size=256 * 2 - 64)]),
        "constant": np.full(512, 0.3),
        "q4_1_grid": (rng.integers(0, 16, size=256 * 8) * 0.01 - 0.07),    # already on a 16-level grid
    }


@needs_ggml
@pytest.mark.parametrize("case", list(_cases()))
def test_q4_k_bit_exact_with_ggml(case):
    x = np.ascontiguousarray(_cases()[case], dtype=np.float32)
    ref = np.zeros((x.size // 256, Q4_K_BYTES), dtype=np.uint8)
    LIB.quantize_row_q4_K_ref(x.ctypes.data, ref.ctypes.data, x.size)
    assert np.array_equal(quantize_q4_k(x), ref)


@needs_ggml
def test_q8_0_bit_exact_with_ggml():
    x = np.ascontiguousarray(_cases()["heavy_tailed"][:32 * 40], dtype=np.float32)
    ref = np.zeros((40, 34), dtype=np.uint8)
    LIB.quantize_row_q8_0_ref(x.ctypes.data, ref.ctypes.data, x.size)
    d = ref[:, :2].copy().view(np.float16).astype(np.float32)               # (40, 1)
    want = (ref[:, 2:].view(np.int8).astype(np.float32) * d).reshape(-1)
    assert np.array_equal(q8_0_roundtrip(x[None])[0], want)


@pytest.mark.parametrize("case", list(_cases()))
def test_q4_k_blocks_are_ggml_layout(case):
    import gguf

    x = np.asarray(_cases()[case], dtype=np.float32)
    b = quantize_q4_k(x)
    assert b.shape == (x.size // 256, Q4_K_BYTES) and b.dtype == np.uint8
    own = dequantize_q4_k(b)
    assert np.array_equal(gguf.quants.dequantize(b, gguf.GGMLQuantizationType.Q4_K).reshape(-1), own)
    rel = np.linalg.norm(own - x) / max(np.linalg.norm(x), 1e-30)
    assert rel < 0.12                                                        # a 4.5-bit format, not garbage
    if case == "normal":
        assert rel > 0.02                                                    # and not a no-op


def test_q4_k_roundtrip_padding_and_shift():
    rng = np.random.default_rng(3)
    w = rng.normal(size=(3, 576)).astype(np.float32)                        # 576 = 2·256 + 64: padded row
    y = q4_k_roundtrip(w)
    pad = np.zeros((3, 768), np.float32)
    pad[:, :576] = w
    assert np.array_equal(y, dequantize_q4_k(quantize_q4_k(pad)).reshape(3, 768)[:, :576])
    ys = q4_k_roundtrip(w, 16)                                              # blocks offset by 16 columns
    assert np.array_equal(ys, np.roll(q4_k_roundtrip(np.roll(w, -16, axis=1)), 16, axis=1))
    assert not np.array_equal(ys, y)
    with pytest.raises(ValueError, match="shift"):
        q4_k_roundtrip(w, 32)
    with pytest.raises(ValueError, match="multiple of 32"):
        q8_0_roundtrip(w[:, :40])


def test_shift_defeats_the_reference_grid():
    """Weights already on a Q4_1-like grid (16 levels per 32-block): Q4_K on the same grid nearly reproduces them,
    with blocks offset by half a block it does not — why the measurement shifts the block grid."""
    rng = np.random.default_rng(5)
    C, D = 16, 512
    d = rng.uniform(0.002, 0.02, size=(C, D // 32, 1))
    m = -7.5 * d + rng.normal(0, 0.002, size=(C, D // 32, 1))
    w = (rng.integers(0, 16, size=(C, D // 32, 32)) * d + m).reshape(C, D).astype(np.float32)
    err = {s: np.linalg.norm(q4_k_roundtrip(w, s) - w) / np.linalg.norm(w) for s in (0, 16)}
    assert err[0] < 0.5 * err[16]


@needs_ggml
@needs_model
def test_q4_k_bit_exact_on_real_weights(smol_weights):
    x = np.ascontiguousarray(smol_weights["blk.3.ffn_down.weight"][:8].reshape(-1), dtype=np.float32)  # 8 × 1536
    ref = np.zeros((x.size // 256, Q4_K_BYTES), dtype=np.uint8)
    LIB.quantize_row_q4_K_ref(x.ctypes.data, ref.ctypes.data, x.size)
    assert np.array_equal(quantize_q4_k(x), ref)


@needs_ggml
@pytest.mark.parametrize("case", ["normal", "heavy_tailed", "all_positive", "zero_blocks"])
def test_q8_k_bit_exact_with_ggml(case):
    from quant.ggml_blocks import q8_k_roundtrip

    lib = LIB
    f = lib.quantize_row_q8_K_ref
    f.restype, f.argtypes = None, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    x = np.ascontiguousarray(_cases()[case], dtype=np.float32)
    ref = np.zeros((x.size // 256, 292), dtype=np.uint8)                    # block_q8_K: d f32, qs[256], bsums[16]
    f(x.ctypes.data, ref.ctypes.data, x.size)
    d = ref[:, :4].copy().view(np.float32)                                  # (nb, 1)
    want = (ref[:, 4:260].view(np.int8).astype(np.float32) * d).reshape(-1)
    assert np.array_equal(q8_k_roundtrip(x[None])[0], want)
