"""The peer protocol set (experiments.protocol_peer, conf/protocol/peer.yaml) and llama.cpp's calibration step
(hil.calibrate_peer): the set, its checks, the prediction's settings, the cold-run bookkeeping with a stand-in for
llama.cpp, the calibration's arithmetic; the real llama.cpp runs skip without the `peer` extra."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from experiments import protocol as pr
from experiments import protocol_peer as pp
from experiments.common import CONF_DIR, ConfigError
from hil import calibrate_peer as cp
from hil import peer
from quant.arch import model_spec
from tests.conftest import REPO
from tests.hil.golden_host import golden_host

needs_extra = pytest.mark.skipif(not peer.available(), reason=peer.INSTALL_HINT)


def _set() -> pr.ProtocolSpec:
    doc = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "protocol" / "peer.yaml"), resolve=True)
    return pr.load_spec(doc)




def test_the_peer_set_is_two_models_three_types_three_prompts_in_about_15_min():
    p = _set()
    assert p.peer and not p.heldout and pr.is_stored(p) and len(p.configurations) == 18
    assert {c.model for c in p.configurations} == {"smollm2_135m", "llama3_2_1b_synth"}
    assert {c.weight_type for c in p.configurations} == {"q8_0", "q4_0", "q4_k_m"}
    assert all(16 <= c.prompt_tokens <= 256 for c in p.configurations)
    assert len({c.prompt_tokens for c in p.configurations}) == 3
    assert pr.estimate_s(p) <= 15 * 60
    pr.check_spec(p)
    pp.check_peer_spec(p)
    assert "q4_k_m/p200" in p.configurations[-1].key


def test_a_peer_set_checks_its_configurations():
    base = _set()
    bad_fw = dataclasses.replace(base, configurations=[pr.Configuration("edgeflow", "smollm2_135m", 5, 16, "q8_0")])
    with pytest.raises(ConfigError, match="a peer set runs llama.cpp"):
        pp.check_peer_spec(bad_fw)
    no_type = dataclasses.replace(base, configurations=[pr.Configuration("llamacpp", "smollm2_135m", 5, 16)])
    with pytest.raises(ConfigError, match="names the llama.cpp file type"):
        pp.check_peer_spec(no_type)
    host_set = dataclasses.replace(base, peer=False,
                                   configurations=[pr.Configuration("llamacpp", "smollm2_135m", 5, 16, "q4_0")])
    with pytest.raises(ConfigError, match="only a peer set"):
        pr.check_spec(host_set)
    with pytest.raises(ValueError, match="weight_type must be one of"):
        pr.Configuration("llamacpp", "smollm2_135m", 5, 16, "q3_x")


def test_prediction_uses_the_peers_settings_and_the_measured_llamacpp_fields(tmp_path):
    spec = model_spec("smollm2_135m")
    host = golden_host(tmp_path, llamacpp_fixed_s=0.092, llamacpp_repack_gbps=0.5,
                 llamacpp_gemm_gops_per_ghz={"Q4_0@576": 10.0, "Q8_0@576": 9.0})
    plan, m = pp.predict_peer(spec, host, "q4_0", 64, 2)
    assert plan.info["use_mmap"] is False and plan.info["gemm_rate"] == "Q4_0@576"
    assert plan.cpu_threads == 2 and plan.loader_threads == 1 and plan.chunk_tokens == 64
    assert plan.info["repack_bytes"] > 0
    assert m["ttft_s"] > 0.092                                          # the fixed stretch is inside
    plan8, m8 = pp.predict_peer(spec, host, "q8_0", 64, 2)
    assert plan8.info["repack_bytes"] == 0
    slow = golden_host(tmp_path, **{**dataclasses.asdict(host.peers), "llamacpp_gemm_gops_per_ghz":
                              {"Q4_0@576": 5.0, "Q8_0@576": 9.0}})
    assert pp.predict_peer(spec, slow, "q4_0", 64, 2)[1]["prefill_s"] > m["prefill_s"]   # half the rate: slower


def test_cold_runs_are_retried_while_warm_and_recorded_per_attempt(monkeypatch, tmp_path):
    cfgs = [pr.Configuration("llamacpp", "smollm2_135m", 5, 16, "q8_0")]
    p = pr.ProtocolSpec(name="t", peer=True, rounds=1, runs_per_round=2, warmup=0, configurations=cfgs)
    prep = [pr.Prepared(cfgs[0], model_spec("smollm2_135m"), None, tmp_path / "m.gguf", [1, 2], {"ttft_s": 0.3})]
    resident = iter([0.0, 0.5, 0.0])            # second slot: warm once, then cold

    def fake(path, tokens, threads, repeats):
        assert repeats == 1 and threads == 2
        return {"resident_before": [next(resident)], "ttft_s": {"runs": [0.31]}, "load_s": {"runs": [0.2]},
                "prefill_s": {"runs": [0.1]}}

    monkeypatch.setattr(peer, "llamacpp_cold_ttft", fake)
    recs, logits = pp.execute_peer(p, prep, 2)
    assert logits == {} and [r.attempt for r in recs] == [0, 0, 1]
    assert [r.counted for r in recs] == [True, False, True] and recs[1].resident_before == 0.5
    assert recs[0].ttft_s == 0.31 and recs[0].load_s == 0.2 and recs[0].unpack_s is None
    j = pr.judge_set(p, prep, recs)
    assert j["rows"][0]["excluded_warm"] == 1 and j["rows"][0]["measured"] == pytest.approx(0.31)


def test_criterion_line():
    assert "**met**" in pp.criterion_md({"protocol_n": 3, "protocol_bias_pct": -9.0, "protocol_mean_abs_pct": 14.0})
    assert "not met" in pp.criterion_md({"protocol_n": 3, "protocol_bias_pct": 11.0, "protocol_mean_abs_pct": 11.0})
    assert pp.criterion_md({}) == ""


# ---- hil.calibrate_peer -------------------------------------------------------------------------------------------
def _times(model: str, ftype: str, d: int, nbytes: int, weights_s: float, slope: float) -> cp.FileTimes:
    return cp.FileTimes(model, ftype, d, nbytes, 0.1, weights_s, 0.002, 0.01,
                        {32: 0.02 + 32 * slope, 128: 0.02 + 128 * slope, 256: 0.02 + 256 * slope}, 1.0)


def test_derive_takes_rates_from_slopes_and_repack_from_the_q4_0_excess(tmp_path):
    spec = model_spec("smollm2_135m")
    dev = golden_host(tmp_path).device
    q8, q4 = 140_000_000, 90_000_000
    times = [_times(spec.name, "Q8_0", 576, q8, 0.14, 1e-3), _times(spec.name, "Q4_0", 576, q4, 0.19, 5e-4)]
    fields, src = cp.derive(times, {spec.name: spec}, dev, 2)
    ghz = dev.thread_ghz(2)
    per_tok = cp.layer_matmul_flops_per_token(spec)
    assert fields["llamacpp_gemm_gops_per_ghz"]["Q8_0@576"] == pytest.approx(per_tok / 1e-3 / 1e9 / ghz)
    assert fields["llamacpp_gemm_gops_per_ghz"]["Q4_0@576"] == pytest.approx(per_tok / 5e-4 / 1e9 / ghz)
    assert fields["llamacpp_fixed_s"] == pytest.approx(0.11 + 0.002 + 0.02)
    from planner.peer_costs import PeerCosts
    from planner.pipeline.cpu_plan import ggml_layers
    rb = sum(ly.repack_bytes for ly in ggml_layers(spec, "Q4_0", PeerCosts(llamacpp_repack_gbps=1), embedding=True))
    PeerCosts(**fields)                                                               # valid peer costs
    assert fields["llamacpp_repack_gbps"] == pytest.approx(rb / (0.19 - q4 * 0.14 / q8) / 1e9)
    assert all(s.startswith("measured") for s in src.values())
    flat = [dataclasses.replace(times[0], eval_s={32: 0.05, 128: 0.04})]
    with pytest.raises(ValueError, match="does not grow"):
        cp.derive(flat, {spec.name: spec}, dev, 2)


def test_peer_step_says_why_it_does_not_measure(monkeypatch, tmp_path):
    monkeypatch.setattr(peer, "available", lambda: False)
    msg = cp.peer_step(tmp_path, log=lambda m: None)
    assert "skipped" in msg and "pip install" in msg and "\n" not in msg
    monkeypatch.setattr(peer, "available", lambda: True)
    assert "quick calibration" in cp.peer_step(tmp_path, quick=True, log=lambda m: None)


def test_calibrate_into_store_rewrites_the_store_whole(monkeypatch, tmp_path):
    from hil.host import STORE_FILES, check_manifest, load_device_json, load_peers, write_store

    dev = golden_host(tmp_path).device
    store = tmp_path / "hosts" / "abc"
    parts = {n: {} for n in STORE_FILES} | {"device.json": {"profile": dataclasses.asdict(dev), "sources": {}}}
    version = write_store(store, parts)                 # as hil.host stores a profile: a link to a version dir
    fields = {"llamacpp_fixed_s": 0.12, "llamacpp_repack_gbps": 0.7, "llamacpp_gemm_gops_per_ghz": {"Q8_0@576": 12.0}}
    monkeypatch.setattr(cp, "calibrate", lambda d, files, prompts, repeats, log: (fields, {"llamacpp_fixed_s":
                                                                                          "measured: x"}, []))
    cp.calibrate_into_store(version, files=[], log=lambda m: None)   # a loaded profile's path: the version dir
    got = load_peers(store)
    assert got.llamacpp_gemm_gops_per_ghz == {"Q8_0@576": 12.0} and got.llamacpp_repack_gbps == 0.7
    assert load_device_json(store / "device.json") == dev                     # the device profile as it was
    assert store.is_symlink() and store.resolve() != version.resolve() and not version.exists()
    assert check_manifest(store.resolve()) == "" and cp.has_fields(store)
    peers = json.loads((store / "peers.json").read_text())
    assert peers["sources"]["llamacpp_fixed_s"] == "measured: x" and peers["llamacpp_calibration"] == []
    assert "llamacpp_calibration" not in json.loads((store / "device.json").read_text())


@needs_extra
def test_time_file_measures_each_phase_of_a_real_llamacpp_load():
    spec = model_spec("smollm2_135m")
    t = cp.time_file(spec, "q8_0", peer.peer_gguf_file(spec, "q8_0"), prompts=(4, 8), threads=2, repeats=1)
    assert t.ftype == "Q8_0" and t.d_model == 576 and t.resident > 0.99
    assert t.open_s > 0 and t.weights_s > 0 and t.context_s > 0 and t.binding_s >= 0 and set(t.eval_s) == {4, 8}
    assert all(v > 0 for v in t.eval_s.values())


@needs_extra
@pytest.mark.slow
def test_peer_protocol_smoke_run(tmp_path):
    """One SmolLM2 configuration, 1 round x 1 run, quick profile: the files and the report's criterion line."""
    run = tmp_path / "run"
    cfgs = "[{framework:llamacpp,model:smollm2_135m,weight_type:q8_0,prompt_tokens:16}]"
    r = subprocess.run([sys.executable, "-m", "experiments.validate", "protocol=peer", "quick_profile=true",
                        f"device.store={tmp_path / 'store'}", "protocol.rounds=1", "protocol.runs_per_round=1",
                        "protocol.warmup=0", f"protocol.configurations={cfgs}", f"hydra.run.dir={run}"],
                       cwd=REPO, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    m = json.loads((run / "metrics.json").read_text())
    assert m["protocol_peer"] and m["protocol_runs"] + m["protocol_runs_excluded_warm"] == 1
    assert "llama.cpp policy acceptance" in (run / "protocol.md").read_text()
