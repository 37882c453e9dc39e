"""experiments.results (one table from a multirun) and experiments.resume (finished jobs are not re-run)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import yaml

from experiments import results, resume

ROOT = Path(__file__).resolve().parents[1]


def _job(root: Path, name: str, overrides: list[str], metrics: dict, measured=(), modelled=(), inputs=(),
         config: str = "a: 1\n") -> Path:
    d = root / name
    (d / ".hydra").mkdir(parents=True)
    (d / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    (d / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump({"hydra": {"job": {"name": "quantize"}}}))
    (d / "config.yaml").write_text(config)
    doc = dict(metrics, measured_keys=list(measured), modelled_keys=list(modelled), input_keys=list(inputs))
    (d / "metrics.json").write_text(json.dumps(doc))
    return d


def _sweep(tmp_path: Path) -> Path:
    root = tmp_path / "sweep"
    for i, (m, b) in enumerate([("edgeflow", 4), ("edgeflow", 5), ("int8", 4)]):
        _job(root, f"{i}_{m}_{b}", [f"method={m}", f"bits={b}", "hydra.launcher.n_jobs=2"],
             {"method": m, "ppl": 20.0 + i, "model_mb": 50.0 + b, "budget": float(b),
              "bits_histogram": {"4": 0.5, "5": 0.5}},
             measured=("ppl",), modelled=("model_mb",), inputs=("budget",))
    (root / "3_unfinished" / ".hydra").mkdir(parents=True)            # killed job: config but no metrics.json
    (root / "3_unfinished" / ".hydra" / "config.yaml").write_text("a: 1\n")
    return root


def test_table_has_factors_and_labels(tmp_path):
    root = _sweep(tmp_path)
    df = results.build(root)
    assert list(df.job) == ["0_edgeflow_4", "1_edgeflow_5", "2_int8_4"]
    assert list(df["sweep.method"]) == ["edgeflow", "edgeflow", "int8"] and list(df["sweep.bits"]) == [4, 5, 4]
    assert "sweep.hydra.launcher.n_jobs" not in df.columns
    assert list(df["measured.ppl"]) == [20.0, 21.0, 22.0]
    assert list(df["modelled.model_mb"]) == [54.0, 55.0, 54.0]
    assert "input.budget" in df.columns and "info.method" in df.columns
    assert json.loads(df["info.bits_histogram"][0]) == {"4": 0.5, "5": 0.5}
    assert set(df.app) == {"quantize"}


def test_parquet_and_csv_round_trip(tmp_path):
    root = _sweep(tmp_path)
    assert results.main([str(root)]) == 0
    back = pd.read_parquet(root / "results.parquet")
    pd.testing.assert_frame_equal(back, results.build(root))
    assert len(pd.read_csv(root / "results.csv")) == 3


def test_bad_sweep_dir(tmp_path, capsys):
    assert results.main([str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err.startswith("error: sweep dir:")
    (tmp_path / "empty").mkdir()
    assert results.main([str(tmp_path / "empty")]) == 2


def test_finished_rules(tmp_path):
    d = _job(tmp_path, "j", [], {"ttft_s": 1.0}, modelled=("ttft_s",), config="x: 1\n")
    assert resume.finished(d) and resume.finished(d, expected=("ttft_s",), config_yaml="x: 1\n")
    assert not resume.finished(d, expected=("energy_j",))                     # an expected key missing
    assert not resume.finished(d, config_yaml="x: 2\n")                       # a different configuration
    (d / ".metrics.json.abc123.tmp").write_bytes(b"{")                          # a partial atomic write
    assert not resume.finished(d)
    (d / ".metrics.json.abc123.tmp").unlink()
    (d / "metrics.json").write_text('{"ttft_s": 1.0, "modelled_keys": ["ttft_s"]}')   # no label lists
    assert not resume.finished(d)
    (d / "metrics.json").write_text('{"ttft_s": 1.0, "measured_keys": [], "modelled_keys": ["ttft_s", "x"], '
                                    '"input_keys": []}')                       # a labelled key missing
    assert not resume.finished(d)
    (d / "metrics.json").write_text("{not json")
    assert not resume.finished(d)
    assert not resume.finished(tmp_path / "nowhere")


# ------------------------------------------------------------------ kill a real sweep midway, re-run, compare
SWEEP = ["-m", "hydra.launcher.n_jobs=1", "model=smollm2_135m", "framework=llamacpp,edgeflow",
         "workload=lambada,obqa", "write_trace=false"]
# the coldstart app with experiments.resume.resumable applied to its run() (what the apps will do once wired)
DRIVER = """import sys
import hydra
import experiments.coldstart as app
from experiments.resume import resumable
run = app.run if getattr(app.run, "resumable", False) else resumable(expected=("ttft_s",))(app.run)
app.precheck("coldstart", sys.argv[1:], app.validate, app.GROUPS, parallel=1)
hydra.main(config_path=str(app.CONF), config_name="coldstart", version_base="1.3")(lambda cfg: run(cfg))()
"""


def _run(sweep_dir: Path, kill_after: int | None = None) -> None:
    cmd = [sys.executable, "-c", DRIVER, *SWEEP, f"hydra.sweep.dir={sweep_dir}", "hydra.job.name=coldstart"]
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    if kill_after is None:
        out, _ = p.communicate(timeout=600)
        assert p.returncode == 0, out.decode()[-2000:]
        return
    deadline = time.time() + 600
    while len(list(sweep_dir.glob("*/metrics.json"))) < kill_after:
        assert p.poll() is None, "the sweep ended before it could be killed"
        assert time.time() < deadline
        time.sleep(0.05)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()


# three 4-job sweeps of the real app, one killed after two jobs (~10 s on 2 cores)
def test_killed_sweep_resumes_only_missing_jobs(tmp_path):
    full, cut = tmp_path / "full", tmp_path / "cut"
    _run(full)
    _run(cut, kill_after=2)
    done = {p.parent.name: p.stat().st_mtime_ns for p in cut.glob("*/metrics.json")}
    assert 2 <= len(done) < 4, done
    _run(cut)
    after = {p.parent.name: p.stat().st_mtime_ns for p in cut.glob("*/metrics.json")}
    assert len(after) == 4
    assert all(after[k] == v for k, v in done.items()), "a finished job was re-run"
    a, b = results.build(full), results.build(cut)
    pd.testing.assert_frame_equal(a, b)                                   # identical to an uninterrupted sweep
    assert {"sweep.framework", "sweep.workload", "modelled.ttft_s"} <= set(a.columns)


def test_callback_writes_the_table_at_multirun_end(tmp_path):
    from omegaconf import OmegaConf

    root = _sweep(tmp_path)
    results.ResultsCallback().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(root)}}}))
    assert len(pd.read_parquet(root / "results.parquet")) == 3


def test_sweep_progress_counts_jobs_and_finished_dirs(tmp_path, capsys):
    from omegaconf import OmegaConf

    from experiments.progress import SweepProgress, sweep_size

    assert sweep_size(["framework=a,b,c", "bits=4,5", "seed=0"]) == 6
    assert sweep_size(["bits=range(1,5)"]) == 4
    assert sweep_size(["bits=interval(1,5)"]) is None
    root = tmp_path / "sweep"
    _job(root, "0_a", [], {"x": 1.0}, modelled=("x",))                 # finished before the sweep (resumed)
    cfg = OmegaConf.create({"hydra": {"sweep": {"dir": str(root)}, "overrides": {"task": ["framework=a,b"]}}})
    cb = SweepProgress(poll_s=0.01)
    cb.on_multirun_start(cfg)
    assert cb.bar.total == 2 and cb.bar.n == 1
    import pickle

    assert pickle.loads(pickle.dumps(cb)).bar is None        # launchers pickle callbacks into the job processes
    _job(root, "1_b", [], {"x": 1.0}, modelled=("x",))
    cb.on_multirun_end(cfg)
    assert cb.bar is None
    assert "2/2" in capsys.readouterr().err


def test_sweep_progress_silenced(tmp_path):
    from omegaconf import OmegaConf

    from experiments.progress import SweepProgress

    cb = SweepProgress()
    cb.on_multirun_start(OmegaConf.create({"progress": False, "hydra": {"sweep": {"dir": str(tmp_path)},
                                                                        "overrides": {"task": []}}}))
    assert cb.bar is None


def test_critical_path_bound_per_phase_is_a_column():
    doc = {"ttft_s": 1.0, "modelled_keys": ["ttft_s", "critical_path"],
           "critical_path": {"load": {"bound": "graph", "seconds": {"graph": 0.4}},
                             "prefill": {"bound": "npu", "seconds": {"npu": 0.6}}, "path_tasks": 3}}
    r = results.row("j", "coldstart", {}, doc)
    assert r["modelled.critical_path.load.bound"] == "graph" and r["modelled.critical_path.prefill.bound"] == "npu"
    assert json.loads(r["modelled.critical_path"])["path_tasks"] == 3
