"""The synthetic-model generator (quant.synth, quant.synth_pack) on a TINY Llama: GGUF files readable, shapes and
types right, the tokenizer works through quant.gguf_model, sampled rows follow the twin, generation is deterministic
per seed, the cache is re-used and a damaged file is regenerated, and the EdgeFlow packed file is written."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest

from quant.arch import ModelSpec, WeightSource
from tests.quant.conftest import needs_model

pytestmark = needs_model

TINY = dict(name="tiny_synth", n_layers=2, d_model=128, d_ffn=256, n_heads=4, n_kv_heads=2, head_dim=32, vocab=49152,
            tied_embeddings=True, rope_base=500000.0, weights=WeightSource.synthetic)


def tiny() -> ModelSpec:
    return ModelSpec(**TINY)


def sha(p) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from quant import synth_pack

    d = tmp_path_factory.mktemp("synth")
    return d, synth_pack.ensure_synth(spec=tiny(), bits=None, out_dir=d)


@pytest.fixture(scope="module")
def readers(files):
    """The parsed readers of both files (quant.gguf_file.open_gguf: parsed once per process, shared with the
    tokenizer and weight loads)."""
    from quant.gguf_file import open_gguf

    _, paths = files
    return {"q8_0": open_gguf(str(paths.q8_0)), "q4_1": open_gguf(str(paths.q4_1))}


def test_gguf_readable_shapes_and_types(files, readers):
    import gguf

    from quant import synth

    _, paths = files
    plan = {tp.name: tp for tp in synth.tensor_plan(tiny())}
    for path, qt in ((paths.q8_0, gguf.GGMLQuantizationType.Q8_0), (paths.q4_1, gguf.GGMLQuantizationType.Q4_1)):
        r = readers[path.name.split(".")[-2]]
        assert {t.name for t in r.tensors} == set(plan)
        for t in r.tensors:
            assert tuple(int(s) for s in reversed(t.shape)) == plan[t.name].shape
            want = (gguf.GGMLQuantizationType.F32 if len(plan[t.name].shape) == 1 else
                    gguf.GGMLQuantizationType.Q8_0 if t.name == "token_embd.weight" else qt)
            assert t.tensor_type == want, t.name
        assert r.fields["llama.block_count"].contents() == 2
        assert r.fields["llama.attention.head_count_kv"].contents() == 2
        assert r.fields["tokenizer.ggml.pre"].contents() == "smollm"
        assert synth.gguf_valid(path, tiny())


def test_tokenizer_and_weights_through_gguf_model(files, monkeypatch):
    from quant import gguf_model, synth

    d, paths = files
    monkeypatch.setattr(synth, "OUT_DIR", d)                 # gguf_path -> ensure_gguf finds the cached tiny files
    spec = tiny()
    assert gguf_model.gguf_path(spec) == paths.q8_0
    tok = gguf_model.load_tokenizer(spec)
    ids = tok.encode('The "assert" statement\n', add_special_tokens=False).ids
    assert ids == [504, 476, 3391, 18, 4814, 198]            # SmolLM2's ids for this check string
    assert tok.decode(ids) == 'The "assert" statement\n'


def test_rows_follow_the_twin(readers):
    import gguf

    from quant import synth
    from quant.twin import load_twin

    spec = tiny()
    w = {t.name: gguf.quants.dequantize(t.data, t.tensor_type).reshape(tuple(int(s) for s in reversed(t.shape)))
         for t in readers["q8_0"].tensors}
    sampler = synth.Sampler(spec, synth.DEFAULT_SEED)
    plan = synth.tensor_plan(spec)
    twin = load_twin()
    for k, tp in enumerate(plan):
        if len(tp.shape) != 2:
            continue
        x = w[tp.name].astype(np.float64)
        rms = np.sqrt(np.mean(x * x, axis=1))
        crest = np.abs(x).max(axis=1) / rms
        crest_t, rms_t = sampler.channel_targets(tp, k)
        crest_t = np.minimum(crest_t, synth.CREST_CAP * np.sqrt(tp.shape[1]))
        assert np.allclose(rms, rms_t, rtol=0.02), tp.name              # Q8_0 rounding only
        assert np.allclose(crest, crest_t, rtol=0.03), tp.name
        if tp.kind != "token_embd":                                      # the targets are the twin's distribution
            z = np.log(crest_t / np.sqrt(2 * np.log(tp.shape[1])))
            q = twin.log_z[tp.kind][tp.layer * twin.depth_bins // spec.n_layers]
            lo, hi = np.interp([0.25, 0.75], twin.probs, q)
            assert lo - 0.05 <= np.median(z) <= hi + 0.05, tp.name


def test_shape_rows_exact_both_regimes():
    from quant.synth import shape_rows

    rng = np.random.default_rng(1)
    x = rng.standard_normal((64, 512), dtype=np.float32)
    crest = np.linspace(2.0, 15.0, 64)                      # below and above a Gaussian row's own crest (~3.5)
    rms = np.linspace(0.01, 1.0, 64)
    y = shape_rows(x.copy(), crest, rms).astype(np.float64)
    got_rms = np.sqrt(np.mean(y * y, axis=1))
    assert np.allclose(got_rms, rms, rtol=1e-4)
    assert np.allclose(np.abs(y).max(axis=1) / got_rms, crest, rtol=1e-3)


def test_deterministic_per_seed_and_cache_reuse(files, tmp_path):
    from quant import synth

    d, paths = files
    again = synth.ensure_gguf(tiny(), "q8_0", out_dir=tmp_path)                 # regenerated from scratch elsewhere
    assert again.name == paths.q8_0.name and sha(again) == sha(paths.q8_0)
    other = synth.ensure_gguf(tiny(), "q8_0", seed=1, out_dir=tmp_path)
    assert other.name != again.name and sha(other) != sha(again)
    mtime = again.stat().st_mtime_ns
    assert synth.ensure_gguf(tiny(), "q8_0", out_dir=tmp_path).stat().st_mtime_ns == mtime     # cache hit
    with open(again, "r+b") as f:                                               # damaged: truncated
        f.truncate(again.stat().st_size - 100)
    assert not synth.gguf_valid(again, tiny())
    assert sha(synth.ensure_gguf(tiny(), "q8_0", out_dir=tmp_path)) == sha(paths.q8_0)


@pytest.mark.slow
def test_packed_file(files):
    from quant import synth_pack
    from quant.pack import PackedFile

    d, _ = files
    paths = synth_pack.ensure_synth(spec=tiny(), bits=5, out_dir=d)
    assert paths.pack is not None and paths.pack.is_file() and paths.bits == 5 and paths.fmt == "weightlet"
    with PackedFile(paths.pack) as pf:
        assert "blk.1.ffn_down.weight" in pf.entries and "token_embd.weight" in pf.entries
        assert pf.meta["model"] == "tiny_synth" and pf.meta["method"] == "edgeflow"
    info = paths.pack.with_suffix(".json").read_text()
    assert '"measured": true' in info and '"peak_rss_gb"' in info


def test_bad_input_one_line():
    from quant import synth, synth_pack

    with pytest.raises(synth.SynthError, match="not a synthetic model"):
        synth.ensure_gguf(ModelSpec(**{**TINY, "weights": WeightSource.twin}))
    with pytest.raises(synth.SynthError, match="qtype"):
        synth.ensure_gguf(tiny(), "q5_0")
    with pytest.raises(synth.SynthError, match="bits"):
        synth_pack.ensure_synth(spec=tiny(), bits=9)
    with pytest.raises(synth.SynthError, match="fmt"):
        synth_pack.ensure_synth(spec=tiny(), bits=5, fmt="nope")
