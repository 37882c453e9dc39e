"""Stale results are not trusted: resume keys on the contents of every input (config text, files the config names,
files the app adds), a metrics.json edited after its run or whose echoed inputs contradict the config is re-run, and
EDGELLM_RESUME / boolean settings take any true/false spelling through one rule (quant.bounds.strict_bool)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from experiments import resume
from experiments.common import write_run_outputs
from tests.badinput.helpers import accept, reject

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def job(tmp_path, monkeypatch):
    """A resumable job run in tmp_path/run (its run directory) with a trace file the config names."""
    monkeypatch.setattr(resume, "HASH_CACHE", tmp_path / "hashes.json")
    resume._hash_memo.clear()
    run = tmp_path / "run"
    run.mkdir()
    monkeypatch.chdir(run)                                  # run_dir() outside Hydra: the working directory
    monkeypatch.delenv(resume.RESUME_ENV, raising=False)
    trace = tmp_path / "t.csv"
    trace.write_text("time_s,link,dbm\n0,link1,-40\n")
    extra = tmp_path / "profile.npz"
    extra.write_bytes(b"profile-1")
    cfg = OmegaConf.create({"bits": 4, "trace": {"csv": str(trace)}, "model": {"name": "m"}})
    calls = []

    @resume.resumable(expected=("x",), files=lambda c: [extra])
    def app(c):
        calls.append(1)
        write_run_outputs(run, c, {"x": 1.5, "bits": 4}, measured=["x"], modelled=[], inputs=["bits"])
        return "ran"

    return app, cfg, calls, run, trace, extra


def test_unchanged_inputs_resume_and_each_changed_input_reruns(job, capsys):
    app, cfg, calls, run, trace, extra = job
    assert app(cfg) == "ran" and len(calls) == 1 and (run / "inputs.json").is_file()
    assert app(cfg)["x"] == 1.5 and len(calls) == 1                 # resumed
    trace.write_text("time_s,link,dbm\n0,link1,-41\n")             # same size, other contents
    app(cfg)
    assert len(calls) == 2 and f"input file {trace} changed" in capsys.readouterr().err
    extra.write_bytes(b"profile-2")                                  # a file the app adds (a measured profile)
    app(cfg)
    assert len(calls) == 3
    app(cfg)
    assert len(calls) == 3


def test_edited_metrics_are_not_trusted(job, capsys):
    app, cfg, calls, run, *_ = job
    app(cfg)
    doc = json.loads((run / "metrics.json").read_text())
    (run / "metrics.json").write_text(json.dumps({**doc, "x": 99.0}))
    app(cfg)
    assert len(calls) == 2 and "metrics.json changed after the run" in capsys.readouterr().err
    doc = json.loads((run / "metrics.json").read_text())             # echoed input contradicts the config, and
    forged = {**doc, "bits": 8}                                      # inputs.json forged to match the edit
    (run / "metrics.json").write_text(json.dumps(forged))
    ins = json.loads((run / "inputs.json").read_text())
    (run / "inputs.json").write_text(json.dumps({**ins, "metrics_sha256": resume.metrics_digest(forged)}))
    app(cfg)
    assert len(calls) == 3 and "bits = 8 in metrics.json, 4 in the config" in capsys.readouterr().err


def test_a_run_killed_before_its_metrics_is_not_finished(job):
    app, cfg, calls, run, *_ = job
    app(cfg)
    (run / "metrics.json").unlink()
    app(cfg)
    assert len(calls) == 2


@pytest.mark.parametrize("spelling, reruns", [("0", True), ("false", True), ("NO", True), ("Off", True),
                                               ("1", False), ("TRUE", False), ("yes", False), ("on", False)])
def test_resume_switch_spellings(job, monkeypatch, spelling, reruns):
    app, cfg, calls, *_ = job
    app(cfg)
    monkeypatch.setenv(resume.RESUME_ENV, spelling)
    app(cfg)
    assert len(calls) == (2 if reruns else 1)


def test_bad_resume_switch_is_one_line(job, monkeypatch, capsys):
    app, cfg, *_ = job
    monkeypatch.setenv(resume.RESUME_ENV, "maybe")
    with pytest.raises(SystemExit) as ei:
        app(cfg)
    err = capsys.readouterr().err
    assert ei.value.code == 2 and err.count("\n") == 1 and err.startswith("error: EDGELLM_RESUME: must be true")


def test_file_digest_cache_follows_size_and_mtime(tmp_path, monkeypatch):
    monkeypatch.setattr(resume, "HASH_CACHE", tmp_path / "hashes.json")
    resume._hash_memo.clear()
    f = tmp_path / "a.bin"
    f.write_bytes(b"aaaa")
    d1 = resume.file_digest(f)
    assert json.loads((tmp_path / "hashes.json").read_text())[str(f.resolve())][2] == d1
    f.write_bytes(b"bbbb")
    os.utime(f, ns=(f.stat().st_atime_ns, f.stat().st_mtime_ns + 1_000_000))
    assert resume.file_digest(f) != d1


def test_input_files_finds_the_trace_and_the_gguf():
    from hydra import compose, initialize_config_dir

    import experiments.validate_cluster  # noqa: F401  (schemas)
    from experiments.common import CONF_DIR
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="validate_cluster")
    names = {p.name for p in resume.input_files(cfg)}
    assert "walk_away_disconnect.csv" in names and any(n.endswith(".gguf") for n in names)


def test_booleans_take_one_rule_in_every_app(capsys):
    for v in ("yes", "no", "ON", "0"):
        accept(capsys, "multidevice", [f"timeline={v}", "turns=1"])
        accept(capsys, "quantize", [f"pack={v}"])
    reject(capsys, "multidevice", ["timeline=maybe"], "timeline")


@pytest.mark.slow
def test_changed_trace_reruns_the_real_app(tmp_path):
    trace = tmp_path / "walk.csv"
    trace.write_text((ROOT / "conf" / "trace" / "walk_away.csv").read_text())
    cmd = [sys.executable, "-m", "experiments.multidevice", "turns=1", f"trace.csv={trace}", "timeline=no",
           f"hydra.run.dir={tmp_path / 'run'}"]
    runs = [subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)]
    runs.append(subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300))
    trace.write_text(trace.read_text().replace(",-4", ",-5", 1))
    runs.append(subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300))
    assert all(r.returncode == 0 for r in runs), [r.stderr[-500:] for r in runs]
    assert "not re-run" in runs[1].stderr, (runs[0].stderr, runs[1].stderr, runs[1].stdout)
    assert "not re-run" not in runs[2].stderr
    assert "walk.csv changed" in runs[2].stderr
    assert not (tmp_path / "run" / "timeline.csv").exists()         # timeline=no: parsed as false
