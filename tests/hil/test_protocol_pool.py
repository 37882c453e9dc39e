"""Several invocations of a protocol set judged as one (experiments.protocol_pool) and the page that shows them
(experiments.report): synthetic run directories, no timing."""
from __future__ import annotations

import json
from dataclasses import asdict

import numpy as np
import pytest
from omegaconf import OmegaConf

from experiments import protocol as pr
from experiments.protocol_pool import pool, read_invocation

CFGS = [pr.Configuration("edgeflow", "smollm2_135m", 5, 16), pr.Configuration("mnn", "smollm2_135m", 5, 16),
        pr.Configuration("edgeflow", "smollm2_135m", 4, 64)]
SPEC = pr.ProtocolSpec(name="dev", seed=1, rounds=3, runs_per_round=2, warmup=0, bootstrap=300, configurations=CFGS)


def _run(tmp_path, name, preds, truth, finished, seed=0):
    """A protocol run directory as `validate protocol=…` writes it, its runs drawn around `truth` (3 % noise)."""
    prepared = [pr.Prepared(c, None, None, None, None, {"ttft_s": p, "load_s": p / 2, "unpack_s": None,
                                                        "prefill_s": p / 2}) for c, p in zip(CFGS, preds)]
    rng = np.random.default_rng(seed)
    recs = []
    for n, s in enumerate(pr.schedule(CFGS, SPEC.rounds, SPEC.runs_per_round, SPEC.warmup, SPEC.seed)):
        t = truth[s.config] * float(np.exp(rng.normal(0, 0.03)))
        recs.append(pr.RunRecord(n, s.kind, s.round, s.pass_, CFGS[s.config].key, 0, t, t / 2, None, t / 2, 0.0,
                                 0.5, float(n), s.kind == "measured"))
    j = pr.judge_set(SPEC, prepared, recs)
    m = pr.metrics(SPEC, j, recs, 10.0)
    d = tmp_path / name
    d.mkdir()
    labels = {"measured_keys": [k for k in m if k not in pr.INPUT_KEYS and not isinstance(m[k], str)],
              "modelled_keys": [], "input_keys": [k for k in pr.INPUT_KEYS if k in m]}
    (d / "metrics.json").write_text(json.dumps(m | labels))
    (d / "manifest.json").write_text(json.dumps({"app": "experiments.validate", "command": "python -m x",
                                                 "finished_utc": finished,
                                                 "machine": {"cpu_model": "Test CPU", "family": 1, "model": 2}}))
    (d / "protocol.csv").write_text(pr._csv(j["rows"]))
    (d / "speedups.csv").write_text(pr._csv(j["speedups"]))
    (d / "runs.csv").write_text(pr.runs_csv(recs))
    (d / "config.yaml").write_text(OmegaConf.to_yaml({"protocol": asdict(SPEC)}))
    return d, m


PRED = [0.10, 0.15, 0.20]


def _at(minute: int) -> str:
    """A finish time in manifest.json's form (ISO 8601, UTC), `minute` minutes into the epoch."""
    return f"{1970}-01-01T00:{minute:02d}:00Z"


def test_one_invocation_pooled_is_its_own_judgement(tmp_path):
    d, m = _run(tmp_path, "a", PRED, [0.11, 0.16, 0.21], _at(1))
    pm, judged, inv, left = pool([read_invocation(d)])
    assert left == [] and len(inv) == 1 and pm["protocol_invocations"] == 1
    for k in ("protocol_bias_pct", "protocol_bias_lo_pct", "protocol_bias_hi_pct", "protocol_mean_abs_pct",
              "protocol_runs", "protocol_rounds"):
        assert pm[k] == pytest.approx(m[k], rel=1e-12), k


def test_invocations_that_drifted_apart_pool_between_them_and_widen_the_interval(tmp_path):
    """One invocation 10 % slow, one 10 % fast, against the same predictions: each alone has a bias of about -/+9 %;
    pooled, about 0 with an interval that spans both."""
    slow, ms = _run(tmp_path, "slow", PRED, [p * 1.1 for p in PRED], _at(1), seed=1)
    fast, mf = _run(tmp_path, "fast", PRED, [p * 0.9 for p in PRED], _at(2), seed=2)
    assert ms["protocol_bias_pct"] < -7 and mf["protocol_bias_pct"] > 7
    pm, _, inv, left = pool([read_invocation(slow), read_invocation(fast)])
    assert [i.dir.name for i in inv] == ["slow", "fast"] and left == []
    assert pm["protocol_rounds"] == 2 * SPEC.rounds and pm["protocol_runs"] == ms["protocol_runs"] + mf["protocol_runs"]
    assert abs(pm["protocol_bias_pct"]) < 3
    width = pm["protocol_bias_hi_pct"] - pm["protocol_bias_lo_pct"]
    assert width > ms["protocol_bias_hi_pct"] - ms["protocol_bias_lo_pct"]


def test_an_invocation_with_other_predictions_is_left_out_and_said(tmp_path):
    old, _ = _run(tmp_path, "old", [0.09, 0.15, 0.20], [0.11, 0.16, 0.21], _at(1))
    new, m = _run(tmp_path, "new", PRED, [0.11, 0.16, 0.21], _at(2))
    pm, _, inv, left = pool([read_invocation(old), read_invocation(new)])
    assert [i.dir.name for i in inv] == ["new"] and len(left) == 1 and left[0].startswith("old: ")
    assert pm["protocol_bias_pct"] == pytest.approx(m["protocol_bias_pct"])


def test_the_page_judges_the_pool_and_lists_every_invocation(tmp_path):
    from experiments.report import load_runs, page_summary, pages_for

    _run(tmp_path, "slow", PRED, [p * 1.1 for p in PRED], _at(1), seed=1)
    _run(tmp_path, "fast", PRED, [p * 0.9 for p in PRED], _at(2), seed=2)
    _run(tmp_path, "other", [0.05, 0.15, 0.20], PRED, _at(0), seed=3)
    (page,) = pages_for(load_runs([tmp_path / "other", tmp_path / "slow", tmp_path / "fast"]))
    assert "6 rounds × 2 cold runs" in page.markdown
    assert "## Invocations" in page.markdown and "| slow |" in page.markdown and "| fast |" in page.markdown
    assert "- other: other predictions" in page.markdown
    assert "2 run dirs" in page_summary(page.markdown)


def test_a_broken_run_directory_is_one_line(tmp_path):
    from experiments.common import ConfigError

    d, _ = _run(tmp_path, "a", PRED, PRED, _at(1))
    (d / "runs.csv").write_text("order,kind\n1,measured\n")
    with pytest.raises(ConfigError, match="not a readable protocol run"):
        read_invocation(d)


def test_a_logits_check_holds_for_the_pool_only_when_it_held_in_every_invocation(tmp_path):
    a, _ = _run(tmp_path, "a", PRED, PRED, _at(1), seed=1)
    b, _ = _run(tmp_path, "b", PRED, PRED, _at(2), seed=2)
    for d, ok in ((a, False), (b, True)):
        m = json.loads((d / "metrics.json").read_text())
        (d / "metrics.json").write_text(json.dumps(m | {"protocol_logits_native_exact": ok}))
    pm, *_ = pool([read_invocation(a), read_invocation(b)])
    assert pm["protocol_logits_native_exact"] is False
    pm, *_ = pool([read_invocation(b)])
    assert pm["protocol_logits_native_exact"] is True
