"""The validation protocol's sets, run order, cold-run bookkeeping and report (experiments.protocol), without timing:
the judged records are synthetic; one real smoke run (2 configurations, 1 round x 1 run) is in the slow tier."""
from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from dataclasses import asdict, replace

import numpy as np
import pytest
from omegaconf import OmegaConf

from experiments import protocol as pr
from experiments.common import CONF_DIR, ConfigError
from tests.conftest import REPO


def _set(name: str) -> pr.ProtocolSpec:
    doc = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "protocol" / f"{name}.yaml"), resolve=True)
    return pr.load_spec(doc)


def test_development_set_is_the_21_configurations_and_runs_in_15_min():
    p = _set("dev")
    assert len(p.configurations) == 21 and not p.heldout and pr.is_stored(p)
    pr.check_spec(p)
    assert pr.estimate_s(p) <= 15 * 60


def test_heldout_set_is_its_seeded_draw_and_an_edited_list_is_refused():
    p = _set("heldout")
    assert p.heldout and len(p.configurations) == 20 and pr.estimate_s(p) <= 15 * 60
    pr.check_spec(p)                                            # the stored list equals the draw
    models = {c.model for c in p.configurations}
    assert {"smollm2_135m", "llama3_2_1b_synth", "qwen2_5_0_5b_synth"} <= models
    assert all(pr.BITS_RANGE[0] <= c.bits <= pr.BITS_RANGE[1] for c in p.configurations)
    assert all(pr.PROMPT_RANGE[0] <= c.prompt_tokens <= pr.PROMPT_RANGE[1] for c in p.configurations)
    assert {c.framework for c in p.configurations} & {"ef_pack", "ef_pipe", "ef_place", "ef_priority", "ef_mixed"}
    dev = {c.key for c in _set("dev").configurations}
    assert not dev & {c.key for c in p.configurations}          # held out: nothing of the development set
    swapped = replace(p, configurations=[replace(p.configurations[0], prompt_tokens=17), *p.configurations[1:]])
    with pytest.raises(ConfigError, match="must be its draw"):
        pr.check_spec(swapped)
    assert pr.draw_configurations(p.draw, p.seed + 1) != pr.draw_configurations(p.draw, p.seed)


def test_bad_sets_are_one_line_errors():
    doc = {"name": "x", "configurations": [{"framework": "edgeflow", "model": "smollm2_135m"}]}
    with pytest.raises(ConfigError, match="rounds"):
        pr.load_spec(doc | {"rounds": 0})
    with pytest.raises(ConfigError, match="appears twice"):
        pr.load_spec(doc | {"configurations": doc["configurations"] * 2})
    with pytest.raises(ConfigError, match="per-channel INT8"):
        pr.check_spec(pr.load_spec(doc | {"configurations": [{"framework": "mnn", "model": "llama3_2_1b_synth"}]}))
    with pytest.raises(ConfigError, match="unknown framework"):
        pr.check_spec(pr.load_spec(doc | {"configurations": [{"framework": "nope", "model": "smollm2_135m"}]}))


def test_schedule_is_seeded_interleaved_and_pairs_share_a_pass():
    cfgs = _set("dev").configurations
    a = pr.schedule(cfgs, rounds=3, runs_per_round=2, warmup=1, seed=5)
    assert a == pr.schedule(cfgs, rounds=3, runs_per_round=2, warmup=1, seed=5)
    assert a != pr.schedule(cfgs, rounds=3, runs_per_round=2, warmup=1, seed=6)
    measured = [s for s in a if s.kind == "measured"]
    assert Counter(s.config for s in measured) == {i: 6 for i in range(len(cfgs))}
    assert Counter(s.config for s in a if s.kind == "warmup") == {i: 1 for i in range(len(cfgs))}
    assert all(s.kind == "warmup" for s in a[:len(cfgs)])
    # each round: a group's passes are contiguous and every member runs once per pass
    for r in range(3):
        slots = [s for s in measured if s.round == r]
        assert len(slots) == 2 * len(cfgs)
        seen = []
        for s in slots:
            g = cfgs[s.config].group
            if not seen or seen[-1] != g:
                assert g not in seen                            # a group is not split within a round
                seen.append(g)
    orders = [[cfgs[s.config].group for s in measured if s.round == r] for r in range(3)]
    assert len({tuple(dict.fromkeys(o)) for o in orders}) > 1  # the groups' order changes between rounds


def _prepared(cfgs, preds):
    return [pr.Prepared(c, None, None, None, None, {"ttft_s": p, "load_s": p / 2, "unpack_s": None,
                                                   "prefill_s": p / 2}) for c, p in zip(cfgs, preds)]


def _records(p, prepared, truth, resident=lambda k: 0.0, seed=0):
    rng = np.random.default_rng(seed)
    recs = []
    for n, s in enumerate(pr.schedule([x.config for x in prepared], p.rounds, p.runs_per_round, p.warmup, p.seed)):
        t = truth[s.config] * float(np.exp(rng.normal(0, 0.03)))
        res = resident(n)
        recs.append(pr.RunRecord(n, s.kind, s.round, s.pass_, prepared[s.config].config.key, 0, t, t / 2, None,
                                 t / 2, res, 0.5, float(n), s.kind == "measured" and res <= pr.COLD_RESIDENT_MAX))
    return recs


def test_judge_set_excludes_warm_runs_and_detects_a_bias():
    cfgs = [pr.Configuration("edgeflow", "smollm2_135m", 5, 16), pr.Configuration("llamacpp", "smollm2_135m", 5, 16),
            pr.Configuration("edgeflow", "smollm2_135m", 4, 64)]
    p = pr.ProtocolSpec(name="t", seed=3, rounds=4, runs_per_round=3, warmup=1, bootstrap=500, configurations=cfgs)
    truth = [0.10, 0.20, 0.15]
    prepared = _prepared(cfgs, [t * 0.8 for t in truth])        # every prediction 20 % low
    warm = {5, 17}                                              # two runs that found the file cached
    recs = _records(p, prepared, truth, resident=lambda n: 0.5 if n in warm else 0.0)
    j = pr.judge_set(p, prepared, recs)
    rows = {r["framework"] + str(r["bits"]): r for r in j["rows"]}
    assert sum(r["excluded_warm"] for r in j["rows"]) == sum(recs[n].kind == "measured" for n in warm)
    assert sum(r["measured_runs"] for r in j["rows"]) + sum(r["excluded_warm"] for r in j["rows"]) == 36
    for r in j["rows"]:
        assert r["error_pct"] == pytest.approx(-20, abs=4) and not r["inside"]
        assert r["measured_lo"] <= r["measured"] <= r["measured_hi"]
    assert rows["llamacpp5"]["resident_before_max"] == 0.5 or rows["edgeflow5"]["resident_before_max"] == 0.5 \
        or rows["edgeflow4"]["resident_before_max"] == 0.5
    (sp,) = j["speedups"]                                       # llamacpp vs EdgeFlow of the same group only
    assert sp["framework"] == "llamacpp" and sp["predicted_speedup"] == pytest.approx(2.0)
    assert sp["measured_speedup"] == pytest.approx(2.0, rel=0.06) and sp["inside"]
    m = pr.metrics(p, j, recs, 1.0)
    assert m["protocol_bias_hi_pct"] < 0 and m["protocol_under"] == 3
    assert m["protocol_runs_excluded_warm"] == sum(r["excluded_warm"] for r in j["rows"])
    assert not m["protocol_stored_set"]
    md = pr.report_md(m, j["rows"], j["speedups"])
    assert "not the stored set" in md and "## Per configuration" in md and "speed-ups" in md
    assert "under load" not in md and "Taken under load" in pr.about_md(m | {"protocol_loadavg_median": 9.0})
    # phases: load and prefill predicted 20 % low like the TTFT; unpack has no figures
    assert "## Per phase" in md and "unpack:" not in md
    for ph in ("load", "prefill"):
        (line,) = [x for x in md.splitlines() if x.startswith(f"- {ph}: ")]
        assert float(line.split("mean error ")[1].split(" %")[0]) == pytest.approx(-20, abs=4)
        assert line.endswith("under-predicted in 3 of 3")


def test_phase_section_reads_csv_strings_and_is_absent_without_phases():
    row = {"framework": "edgeflow", "model": "m", "bits": "5", "prompt_tokens": "16", "error_pct": "1.0",
           "predicted_load_s": "0.1", "measured_load_s": "0.125", "load_error_pct": "-20.0",
           "predicted_unpack_s": "", "measured_unpack_s": "", "unpack_error_pct": "",
           "predicted_prefill_s": "0.2", "measured_prefill_s": "0.16", "prefill_error_pct": "25.0"}
    md = "\n".join(pr.phases_md([row, row | {"load_error_pct": "10.0"}]))
    assert "- load: mean error -5.0 %, mean |error| 15.0 %, under-predicted in 1 of 2" in md
    assert "- prefill: mean error +25.0 %" in md and "- unpack" not in md
    assert "| 0.100 / 0.125, -20.0 % | – | 0.200 / 0.160, +25.0 % |" in md
    assert pr.phases_md([{k: v for k, v in row.items() if "_s" not in k and "error" not in k}]) == []


def test_runs_csv_has_every_attempt_with_its_resident_fraction():
    cfgs = [pr.Configuration("edgeflow", "smollm2_135m", 5, 16)]
    p = pr.ProtocolSpec(name="t", rounds=1, runs_per_round=2, warmup=1, configurations=cfgs)
    recs = _records(p, _prepared(cfgs, [0.1]), [0.1], resident=lambda n: 0.25 if n == 1 else 0.0)
    text = pr.runs_csv(recs)
    head, *lines = text.strip().splitlines()
    assert head.split(",")[:6] == ["order", "kind", "round", "pass", "config", "attempt"]
    assert "resident_before" in head and "counted" in head and len(lines) == 3
    assert lines[1].endswith("False") and ",0.25," in lines[1]


@pytest.mark.slow
def test_protocol_smoke_run_writes_the_report(tmp_path):
    """Two SmolLM2 configurations, 1 round x 1 run, quick profile: the files, keys and the report page."""
    run = tmp_path / "run"
    cfgs = ("[{framework:edgeflow,model:smollm2_135m,bits:5,prompt_tokens:16},"
            "{framework:llamacpp,model:smollm2_135m,bits:5,prompt_tokens:16}]")
    r = subprocess.run([sys.executable, "-m", "experiments.validate", "protocol=dev", "quick_profile=true",
                        f"device.store={tmp_path / 'store'}", "check_logits=false", "protocol.rounds=1",
                        "protocol.runs_per_round=1", "protocol.warmup=0", f"protocol.configurations={cfgs}",
                        f"hydra.run.dir={run}"], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    m = json.loads((run / "metrics.json").read_text())
    assert m["protocol_runs"] + m["protocol_runs_excluded_warm"] == 2 and m["protocol_logits_native_exact"]
    assert "protocol_bias_pct" in m["measured_keys"] and "protocol_seed" in m["input_keys"]
    for f in ("runs.csv", "protocol.csv", "speedups.csv", "protocol.md", "protocol.png"):
        assert (run / f).is_file(), f
    from experiments.report import load_runs, pages_for

    (page,) = pages_for(load_runs([run]))
    assert page.topic.startswith("host-protocol-dev-") and "Bias" in page.markdown


def test_report_makes_a_protocol_page_from_the_run_files(tmp_path):
    """experiments.report turns a protocol run directory (metrics.json, protocol.csv, speedups.csv) into its own
    host-protocol-<set>-<kind> page, apart from the per-invocation page."""
    from experiments.report import load_runs, page_summary, pages_for

    cfgs = [pr.Configuration("edgeflow", "smollm2_135m", 5, 16), pr.Configuration("mnn", "smollm2_135m", 5, 16)]
    p = pr.ProtocolSpec(name="dev", seed=1, rounds=3, runs_per_round=2, warmup=0, bootstrap=300, configurations=cfgs)
    prepared = _prepared(cfgs, [0.1, 0.15])
    recs = _records(p, prepared, [0.11, 0.14])
    j = pr.judge_set(p, prepared, recs)
    m = pr.metrics(p, j, recs, 1.0)
    run = tmp_path / "run"
    run.mkdir()
    labels = {"measured_keys": [k for k in m if k not in pr.INPUT_KEYS and not isinstance(m[k], str)],
              "modelled_keys": [], "input_keys": [k for k in pr.INPUT_KEYS if k in m]}
    (run / "metrics.json").write_text(json.dumps(m | labels))
    (run / "manifest.json").write_text(json.dumps({"app": "experiments.validate", "command": "python -m x",
                                                   "machine": {"cpu_model": "Test CPU", "family": 1, "model": 2}}))
    (run / "protocol.csv").write_text(pr._csv(j["rows"]))
    (run / "speedups.csv").write_text(pr._csv(j["speedups"]))
    (run / "runs.csv").write_text(pr.runs_csv(recs))
    (run / "config.yaml").write_text(OmegaConf.to_yaml({"protocol": asdict(p)}))
    (page,) = pages_for(load_runs([run]))
    assert page.topic.startswith("host-protocol-dev-")
    summary = page_summary(page.markdown)
    assert "Bias (mean signed TTFT error)" in summary and "sign test" in summary
    assert "| mnn | smollm2_135m | 5 | 16 |" in page.markdown and "speed-ups" in page.markdown
    assert list(page.table["framework"]) == ["edgeflow", "mnn"]


@pytest.mark.parametrize("opt_in", [False, True])
def test_protocol_passes_the_change_system_opt_in_to_the_memory_hold(monkeypatch, tmp_path, opt_in):
    """`validate protocol=… change_system=true` must reach the hold of the VM's page reporting (hil.hostmem): without
    it the set runs with reporting on whatever the user asked."""
    import hil.hostmem

    seen = {}

    class Stop(Exception):
        pass

    def hold(mode, prefault_bytes=0, change_system=False, **kw):
        seen.update(mode=mode, change_system=change_system)
        raise Stop

    monkeypatch.setattr(hil.hostmem, "hold", hold)
    with pytest.raises(Stop):
        pr.run_set(_set("dev"), lambda: None, None, tmp_path, "hold", True, False, None, opt_in)
    assert seen == {"mode": "hold", "change_system": opt_in}
