"""The MNN peer (docs/hil.md "The MNN peer"): the conversion's cache, errors and argument parsing (hil.mnn_convert,
with a stand-in converter), the converter's telemetry guard (hil/mnn_export.py), the MNN policy's measured plan
(planner.pipeline.cpu_plan), the MNN protocol set and its cold-run bookkeeping (experiments.protocol_peer), the
calibration's arithmetic (hil.calibrate_mnn); the real conversion skips without the `mnn-convert` extra and the real
MNN runs without the `mnn` extra."""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from experiments import protocol as pr
from experiments import protocol_peer as pp
from experiments.common import CONF_DIR, ConfigError
from hil import calibrate_mnn as cm
from hil import mnn_convert as mc
from hil import mnn_peer
from planner.peer_costs import PeerCosts
from planner.pipeline.cpu_plan import build_mnn_plan, mnn_layers
from quant.arch import ModelSpec, WeightSource, model_spec
from tests.hil.golden_host import golden_host

needs_mnn = pytest.mark.skipif(not mnn_peer.available(), reason=mnn_peer.INSTALL_HINT)
needs_convert = pytest.mark.skipif(any(importlib.util.find_spec(n) is None for n in mc.CONVERT_MODULES),
                                   reason=f"conversion extra missing: {mc.CONVERT_HINT}")
MEASURED = dict(mnn_fixed_s=0.12, mnn_load_gbps={"b8": 0.6, "b4": 0.4},
                mnn_gemm_gops_per_ghz={"b8@576": 12.0, "b4@576": 10.0})




def _set() -> pr.ProtocolSpec:
    doc = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "protocol" / "mnn.yaml"), resolve=True)
    return pr.load_spec(doc)


# ---- hil.mnn_convert ----------------------------------------------------------------------------------------------
def test_arguments_and_bits():
    assert mc.parse_args(["model=smollm2_135m", "bits=4"]) == {"model": "smollm2_135m", "bits": 4, "python": None}
    assert mc.parse_args(["model=x"])["bits"] == 8
    for argv, msg in ((["bits=8"], "model=<name> is required"), (["model=x", "bits=5"], "bits must be one of 4, 8"),
                      (["model=x", "bits=eight"], "bits must be one of"),
                      (["model=x", "threads=2"], "unknown argument"), (["model="], "unknown argument")):
        with pytest.raises(ValueError, match=msg):
            mc.parse_args(argv)
    with pytest.raises(ValueError, match="bits must be one of"):
        mc.check_bits(True)


def test_cli_errors_are_one_line():
    for argv, code, msg in ((["model=nope"], 2, "model:"), (["model=llama3_8b"], 2, "no weights on this machine"),
                            (["model=smollm2_135m", "bits=3"], 2, "bits must be one of")):
        r = subprocess.run([sys.executable, "-m", "hil.mnn_convert", *argv], capture_output=True, text=True,
                           cwd=Path(__file__).resolve().parents[2])
        assert r.returncode == code, r.stderr
        assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: ") and msg in r.stderr


def test_missing_modules_matches_this_interpreter():
    assert mc.missing_modules(sys.executable) == [n for n in mc.CONVERT_MODULES if importlib.util.find_spec(n) is None]
    with pytest.raises(mc.ConvertError, match="cannot run it"):
        mc.missing_modules("/nonexistent/python")


def _fake_python(tmp_path: Path, body: str) -> str:
    """A stand-in interpreter: `-c` (the module probe, the version query) answers that nothing is missing; the
    conversion script call runs `body` (sh) with $OUT set to its --out directory."""
    exe = tmp_path / "fakepython"
    exe.write_text("#!/bin/sh\nif [ \"$1\" = -c ]; then echo ''; exit 0; fi\n"
                   "while [ $# -gt 0 ]; do [ \"$1\" = --out ] && OUT=$2; shift; done\n"
                   f"echo run >> {tmp_path}/calls\n{body}\n")
    exe.chmod(0o755)
    return str(exe)


@pytest.fixture
def source(tmp_path, monkeypatch):
    src = tmp_path / "model.gguf"
    src.write_bytes(b"GGUF" + bytes(range(256)) * 8)
    monkeypatch.setattr(mc, "source_gguf", lambda spec: src)
    return src


def test_conversion_is_atomic_cached_by_source_hash_and_checked(tmp_path, source):
    spec = model_spec("smollm2_135m")
    ok = _fake_python(tmp_path, "mkdir -p $OUT; for f in " + " ".join(mc.FILES) + "; do echo x > $OUT/$f; done")
    root = tmp_path / "mnn"
    d = mc.ensure_mnn_model(spec, 4, python=ok, root=root, log=lambda m: None)
    assert d.name == f"smollm2_135m-{mc.sha256(source)[:12]}.b4g{mc.MNN_BLOCK}" and d.parent == root
    man = mc.read_manifest(d)
    assert man["bits"] == 4 and man["source_sha256"] == mc.sha256(source) and set(man["files"]) == set(mc.FILES)
    assert [p.name for p in root.iterdir() if p.name.startswith(".")] == []          # no temporary left
    assert mc.ensure_mnn_model(spec, 4, python=ok, root=root) == d
    assert (tmp_path / "calls").read_text().count("run") == 1                        # re-used, not converted again
    (d / "llm.mnn.weight").write_text("truncated")                                    # size no longer the recorded one
    assert mc.read_manifest(d) is None
    mc.ensure_mnn_model(spec, 4, python=ok, root=root, log=lambda m: None)
    assert (tmp_path / "calls").read_text().count("run") == 2 and mc.read_manifest(d) is not None
    source.write_bytes(b"GGUF other weights")                                         # another source: another dir
    assert mc.ensure_mnn_model(spec, 4, python=ok, root=root, log=lambda m: None) != d


def test_conversion_errors_name_the_cause_and_leave_nothing(tmp_path, source, monkeypatch):
    spec = model_spec("smollm2_135m")
    root = tmp_path / "mnn"
    bad = _fake_python(tmp_path, "echo 'Traceback ...'; echo 'KeyError: boom' >&2; exit 3")
    with pytest.raises(mc.ConvertError, match=r"failed \(exit 3\): KeyError: boom \(log .*\.log\)"):
        mc.ensure_mnn_model(spec, 8, python=bad, root=root, log=lambda m: None)
    assert [p.suffix for p in root.iterdir()] == [".log"]                             # the log, no directory
    short = _fake_python(tmp_path, "mkdir -p $OUT; echo x > $OUT/config.json")
    with pytest.raises(mc.ConvertError, match="wrote no llm.mnn"):
        mc.ensure_mnn_model(spec, 8, python=short, root=root, log=lambda m: None)
    monkeypatch.setattr(mc, "missing_modules", lambda python: ["torch", "llmexport"])
    with pytest.raises(mc.ConvertError, match=r"lacks torch, llmexport: install the conversion extra"):
        mc.ensure_mnn_model(spec, 8, python=sys.executable, root=root)


def test_the_exporter_runs_without_telemetry_or_pip():
    """hil/mnn_export.py's guard: MNN's converter module imports without its logger (no pip install, no network)."""
    code = ("import sys; sys.path.insert(0, 'hil'); import mnn_export, os; mnn_export.no_telemetry(); "
            "assert os.environ['PIP_NO_INDEX'] == '1'; "
            "assert sys.modules['MNN.tools.utils.log'].mnn_logger is None; import importlib.util as u; "
            "ok = u.find_spec('MNN') is None; "
            "m = None if ok else __import__('MNN.tools.mnnconvert', fromlist=['x']); "
            "assert ok or m.mnn_logger is None; print('clean')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=Path(__file__).resolve().parents[2], env=dict(os.environ, PIP_NO_INDEX="1"))
    assert r.returncode == 0, r.stderr
    assert "clean" in r.stdout and "pip install" not in r.stdout + r.stderr


@needs_convert
@needs_mnn
def test_convert_and_run_a_tiny_synthetic_model(tmp_path, monkeypatch):
    from quant.synth import ensure_gguf

    spec = ModelSpec(name="tiny_mnn", n_layers=2, d_model=128, d_ffn=256, n_heads=4, n_kv_heads=2, head_dim=32,
                     vocab=49152, tied_embeddings=True, rope_base=500000.0, weights=WeightSource.synthetic)
    src = ensure_gguf(spec, "q8_0", out_dir=tmp_path)
    monkeypatch.setattr(mc, "source_gguf", lambda s: src)
    d = mc.ensure_mnn_model(spec, 4, root=tmp_path / "mnn", log=lambda m: None)
    assert sum(mnn_layers(spec, 4, mc.MNN_BLOCK)) == pytest.approx((d / "llm.mnn.weight").stat().st_size, rel=0.02)
    r = mnn_peer.mnn_cold_ttft(d, [504, 476, 3391, 18], threads=1, repeats=2, n_vocab=spec.vocab)
    assert r["measured"] and r["peer"] == "MNN" and r["prompt_tokens"] == 4 and r["resident_before"] == [0.0, 0.0]
    assert len(set(r["first_token"])) == 1 and 0 <= r["first_token"][0] < spec.vocab
    assert all(t >= lo for t, lo in zip(r["ttft_s"]["runs"], r["load_s"]["runs"]))


@needs_mnn
def test_cold_ttft_on_a_converted_smollm2_directory():
    """The real runtime on the cached SmolLM2 conversion (skips where it was never converted)."""
    d = mc.cached_mnn_model(model_spec("smollm2_135m"), 4)
    if d is None:
        pytest.skip("SmolLM2 not converted here: python -m hil.mnn_convert model=smollm2_135m bits=4")
    r = mnn_peer.mnn_cold_ttft(d, [504, 476, 3391, 18], threads=1, repeats=2, n_vocab=49152)
    assert r["resident_before"] == [0.0, 0.0] and r["precision"] == "low" and r["use_mmap"] is False
    assert len(set(r["first_token"])) == 1 and r["file_bytes"] == sum(p.stat().st_size for p in
                                                                      mnn_peer.model_files(d))
    assert all(0 < lo <= t for lo, t in zip(r["perf_load_s"]["runs"], r["ttft_s"]["runs"]))


@needs_mnn
def test_load_overlap_probe_on_a_converted_smollm2_directory():
    """The cold/warm load and read probe (hil.diagnostics.mnn_overlap) on the cached SmolLM2 conversion."""
    from hil.diagnostics import mnn_overlap

    d = mc.cached_mnn_model(model_spec("smollm2_135m"), 4)
    if d is None:
        pytest.skip("SmolLM2 not converted here: python -m hil.mnn_convert model=smollm2_135m bits=4")
    m = mnn_overlap.overlap([d], rounds=1)[d.name]
    assert all(m[k] > 0 for k in mnn_overlap.KINDS) and set(m) == {*mnn_overlap.KINDS, "exposed_share"}


# ---- hil.mnn_peer -------------------------------------------------------------------------------------------------
def test_without_extra_one_line(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "MNN", None)
    monkeypatch.setitem(sys.modules, "MNN.llm", None)
    for call in (lambda: mnn_peer.mnn_cold_ttft(tmp_path, [1, 2]), mnn_peer.peer_version):
        with pytest.raises(mnn_peer.PeerUnavailable) as e:
            call()
        assert "\n" not in str(e.value) and "pip install 'edgellm[mnn]'" in str(e.value)
    assert mnn_peer.available() is False


def test_model_files_and_eviction_over_the_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        mnn_peer.model_files(tmp_path)
    for i, n in enumerate(mnn_peer.MODEL_FILES):
        (tmp_path / n).write_bytes(b"x" * 4096 * (i + 1))
    files = mnn_peer.model_files(tmp_path)
    assert mnn_peer.evict_files(files) == 0.0
    for p in files:
        p.read_bytes()
    assert 0.0 <= mnn_peer.evict_files(files, evict=False) <= 1.0


@needs_mnn
def test_cold_ttft_checks_its_input(tmp_path):
    for n in mnn_peer.MODEL_FILES:
        (tmp_path / n).write_text("{}")
    with pytest.raises(ValueError, match="ids must be in"):
        mnn_peer.mnn_cold_ttft(tmp_path, [1, 60000], n_vocab=49152)
    with pytest.raises(ValueError, match="threads"):
        mnn_peer.mnn_cold_ttft(tmp_path, [1, 2], threads=0)
    with pytest.raises(ValueError, match="repeats"):
        mnn_peer.mnn_cold_ttft(tmp_path, [1, 2], repeats=0)


# ---- the MNN policy's plan -----------------------------------------------------------------------------------------
def test_mnn_file_bytes_per_layer():
    spec = model_spec("smollm2_135m")
    per = mnn_layers(spec, 8, 64)
    linear = sum(c * d for c, d in spec.linear_shapes().values())
    assert len(per) == spec.n_layers + 1 and per[0] == linear + linear // 64 * 8
    assert per[-1] == spec.vocab * spec.d_model * (1 + 8 / 64)
    assert mnn_layers(spec, 4, 64)[0] == linear // 2 + linear // 64 * 8
    assert mnn_layers(spec, 8, 0)[0] == linear + 8 * sum(d for _c, d in spec.linear_shapes().values())


def test_measured_mnn_plan_and_its_fallback(tmp_path):
    spec = model_spec("smollm2_135m")
    host = golden_host(tmp_path, **MEASURED)
    fw = dataclasses.replace(pr.framework_spec("mnn"), chunk_tokens=64, compute_threads=2)
    plan = build_mnn_plan(spec, host.device, fw, 64, weight_bits=4, quant_block=64, peers=host.peers)
    assert plan.info["gemm_rate"] == "b4@576" and plan.info["weight_bits"] == 4 and plan.loader_threads == 2
    assert plan.info["flash_bytes"] == sum(mnn_layers(spec, 4, 64))
    fixed = [t for t in plan.tasks if t.name == "mnn.fixed"]
    assert len(fixed) == 1 and fixed[0].duration_s == 0.12
    reads = [t for t in plan.tasks if t.name.startswith("read.L")]
    setups = [t for t in plan.tasks if t.name.startswith("setup.L")]
    assert len(reads) == len(setups) == spec.n_layers + 1 and all(t.duration_s == 0 for t in reads)
    assert setups[0].duration_s == pytest.approx(reads[0].read_bytes / 0.4e9)
    for i, (r, s) in enumerate(zip(reads, setups)):      # a layer's set-up waits for its read and the previous set-up;
        assert r.id in s.deps and (i == 0 or setups[i - 1].id in s.deps)   # reads only for the previous read
        assert i == 0 or r.deps == [reads[i - 1].id]
    assert all(w.kind == "matmul" for t in plan.tasks if t.resource == "cpu" for w in t.works)
    paper = build_mnn_plan(spec, host.device, fw, 64)      # no peer costs (the runner's plan): the paper's policy
    assert "gemm_rate" not in paper.info and not any(t.name == "mnn.fixed" for t in paper.tasks)


def test_prediction_needs_the_measured_rate_and_follows_it(tmp_path):
    spec = model_spec("smollm2_135m")
    with pytest.raises(ConfigError, match="python -m hil.calibrate_mnn"):
        pp.predict_mnn(spec, golden_host(tmp_path), 8, 64, 2)
    host = golden_host(tmp_path, **MEASURED)
    plan, m = pp.predict_mnn(spec, host, 8, 64, 2)
    assert plan.cpu_threads == 2 and plan.chunk_tokens == 64 and m["ttft_s"] > 0.12
    slow = golden_host(tmp_path, **{**MEASURED, "mnn_gemm_gops_per_ghz": {"b8@576": 6.0, "b4@576": 10.0}})
    assert pp.predict_mnn(spec, slow, 8, 64, 2)[1]["prefill_s"] > m["prefill_s"]       # half the rate: slower


# ---- the MNN protocol set -----------------------------------------------------------------------------------------
def test_the_mnn_set_is_two_models_two_bit_widths_three_prompts():
    p = _set()
    assert p.peer and not p.heldout and pr.is_stored(p) and len(p.configurations) == 12
    assert {c.model for c in p.configurations} == {"smollm2_135m", "llama3_2_1b_synth"}
    assert {c.bits for c in p.configurations} == {4, 8} and {c.framework for c in p.configurations} == {"mnn"}
    assert pp.check_peer_spec(p) == "mnn"
    assert "mnn/smollm2_135m/b8/p16" == p.configurations[0].key


def test_a_peer_set_runs_one_peer_with_its_files():
    base = _set()
    cases = (([pr.Configuration("mnn", "smollm2_135m", 8, 16), pr.Configuration("llamacpp", "smollm2_135m", 5, 16,
                                                                                "q8_0")], "runs one peer"),
             ([pr.Configuration("mnn", "smollm2_135m", 8, 16, "q8_0")], "names its weight bits"),
             ([pr.Configuration("mnn", "smollm2_135m", 5, 16)], "4 or 8-bit"),
             ([pr.Configuration("edgeflow", "smollm2_135m", 5, 16)], "llama.cpp .* or MNN"))
    for cfgs, msg in cases:
        with pytest.raises(ConfigError, match=msg):
            pp.check_peer_spec(dataclasses.replace(base, configurations=cfgs))


def test_mnn_cold_runs_are_retried_while_warm(monkeypatch, tmp_path):
    cfgs = [pr.Configuration("mnn", "smollm2_135m", 8, 16)]
    p = pr.ProtocolSpec(name="t", peer=True, rounds=1, runs_per_round=2, warmup=0, configurations=cfgs)
    prep = [pr.Prepared(cfgs[0], model_spec("smollm2_135m"), None, tmp_path, [1, 2], {"ttft_s": 0.5})]
    resident = iter([0.0, 0.4, 0.0])

    def fake(path, tokens, threads, repeats, n_vocab):
        assert repeats == 1 and threads == 2 and n_vocab == 49152 and path == tmp_path
        return {"resident_before": [next(resident)], "ttft_s": {"runs": [0.52]}, "load_s": {"runs": [0.3]},
                "prefill_s": {"runs": [0.2]}}

    monkeypatch.setattr(mnn_peer, "mnn_cold_ttft", fake)
    recs, logits = pp.execute_peer(p, prep, 2)
    assert logits == {} and [r.attempt for r in recs] == [0, 0, 1] and [r.counted for r in recs] == [True, False, True]
    assert pp.Peer("mnn").criterion_md({"protocol_n": 2, "protocol_bias_pct": 3.0, "protocol_mean_abs_pct": 5.0}) \
        .startswith("- MNN policy acceptance") and "**met**" in pp.criterion_md(
            {"protocol_n": 2, "protocol_bias_pct": 3.0, "protocol_mean_abs_pct": 5.0}, "MNN")


# ---- hil.calibrate_mnn --------------------------------------------------------------------------------------------
def _times(model: str, bits: int, d: int, wbytes: int, own_load: float, slope: float, icpt: float = 0.03
           ) -> cm.DirTimes:
    return cm.DirTimes(model, bits, d, wbytes, wbytes + 10, 0.01, 0.01 + own_load,
                       {32: icpt + 32 * slope, 128: icpt + 128 * slope, 256: icpt + 256 * slope}, 1.0)


def test_derive_takes_rates_from_slopes_and_load_from_two_model_sizes(tmp_path):
    small, big = model_spec("smollm2_135m"), model_spec("llama3_2_1b_synth")
    dev = golden_host(tmp_path).device
    times = [_times(small.name, 8, 576, 150_000_000, 0.05 + 0.15, 2e-3),
             _times(big.name, 8, big.d_model, 1_500_000_000, 0.05 + 1.5, 1e-2),
             _times(small.name, 4, 576, 80_000_000, 0.05 + 0.16, 2.5e-3),
             _times(big.name, 4, big.d_model, 800_000_000, 0.05 + 1.6, 1.2e-2)]
    fields, src = cm.derive(times, {s.name: s for s in (small, big)}, dev, 2)
    assert set(fields) == set(cm.FIELDS) and set(src) == set(cm.FIELDS)
    assert fields["mnn_load_gbps"] == pytest.approx({"b8": 1.0, "b4": 0.5})
    assert fields["mnn_fixed_s"] == pytest.approx(0.05 + 0.03)
    flops = cm.layer_matmul_flops_per_token(small)
    assert fields["mnn_gemm_gops_per_ghz"]["b8@576"] == pytest.approx(flops / 2e-3 / 1e9 / dev.thread_ghz(2))
    PeerCosts(**fields)                                                               # valid peer costs
    with pytest.raises(ValueError, match="two model sizes"):
        cm.derive(times[:1] + times[2:3], {s.name: s for s in (small, big)}, dev, 2)
    flat = [times[0], dataclasses.replace(times[1], load_s=0.1)]
    with pytest.raises(ValueError, match="does not grow"):
        cm.derive(flat, {s.name: s for s in (small, big)}, dev, 2)


def test_the_calibration_step_says_why_it_skips(monkeypatch, tmp_path):
    lines: list[str] = []
    monkeypatch.setattr(mnn_peer, "available", lambda: False)
    assert "pip install 'edgellm[mnn]'" in cm.mnn_step(tmp_path, log=lines.append)
    monkeypatch.setattr(mnn_peer, "available", lambda: True)
    assert "quick calibration" in cm.mnn_step(tmp_path, quick=True, log=lines.append)
    (tmp_path / "device.json").write_text(json.dumps({"profile": {"mnn_gemm_gops_per_ghz": {"b8@576": 9.0}}}))
    assert "kept the measured fields" in cm.mnn_step(tmp_path, log=lines.append)
    monkeypatch.setattr(cm, "default_dirs", lambda convert: None)
    assert "not converted" in cm.mnn_step(tmp_path, remeasure=True, log=lines.append)
    assert len(lines) == 4 and all("\n" not in ln for ln in lines)


def test_only_a_current_conversion_is_found_without_converting(tmp_path, source):
    spec = model_spec("smollm2_135m")
    assert mc.cached_mnn_model(spec, 8, root=tmp_path) is None
    d = mc.model_dir(spec, 8, mc.sha256(source), tmp_path)
    d.mkdir(parents=True)
    for n in mc.FILES:
        (d / n).write_text("x")
    (d / mc.MANIFEST).write_text(json.dumps({"files": {n: 1 for n in mc.FILES}}))
    assert mc.cached_mnn_model(spec, 8, root=tmp_path) == d
    source.write_bytes(b"GGUF changed")
    assert mc.cached_mnn_model(spec, 8, root=tmp_path) is None
