"""Batch sweeps (experiments.sweep; docs/sweeps.md "Batch sweeps"): a grid's configurations in worker processes into
one results table with the schema of a Hydra `-m` sweep's, resumed after a partial run; bad input is one line."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from experiments.common import ConfigError
from experiments.results import build
from experiments.sweep import GridSpec, SweepSpec, points, run_sweep

ROOT = Path(__file__).resolve().parents[1]


def _grid(name: str) -> GridSpec:
    doc = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "grid" / f"{name}.yaml"))
    return GridSpec(**{k: v for k, v in doc.items() if k != "defaults"})


def _spec(out: Path, grid: GridSpec, **kw) -> SweepSpec:
    return SweepSpec(grid=grid, out=str(out), progress=False, **kw)


def test_small_grid_runs_in_workers_and_resumes_after_a_partial_run(tmp_path):
    grid = _grid("coldstart_small")
    first = run_sweep(_spec(tmp_path / "a", grid, workers=2, chunk=2))
    assert (first.total, first.ran, first.skipped, first.failed) == (12, 12, 0, 0)
    full = pd.read_parquet(first.table)
    assert len(full) == 12 and full["job"].tolist() == [k for k, _ in points(grid)]
    for col in ("sweep.framework", "sweep.prompt_tokens", "sweep.bits", "sweep.model", "sweep.bits_source"):
        assert col in full.columns
    assert full["sweep.bits"].dtype == float and full["sweep.prompt_tokens"].dtype == "int64"
    assert (full["modelled.ttft_s"] > 0).all() and full["modelled.ttft_s"].nunique() > 3
    assert (tmp_path / "a" / "results.csv").is_file()

    # a kill: two chunks' parts never written (parts are atomic), a partial file of an interrupted write left behind
    parts = sorted((tmp_path / "a" / "parts").glob("part-*.parquet"))
    assert len(parts) == 6
    lost = sum(len(pd.read_parquet(p)) for p in parts[:2])
    for p in parts[:2]:
        p.unlink()
    (tmp_path / "a" / "parts" / ".part-0123.parquet.x1y2.tmp").write_bytes(b"PAR1 partial")
    second = run_sweep(_spec(tmp_path / "a", grid, workers=2, chunk=2))
    assert (second.ran, second.skipped) == (lost, 12 - lost)
    pd.testing.assert_frame_equal(pd.read_parquet(second.table), full)
    third = run_sweep(_spec(tmp_path / "a", grid, workers=1))
    assert (third.ran, third.skipped) == (0, 12)
    again = run_sweep(_spec(tmp_path / "a", grid, workers=1, resume=False))
    assert again.ran == 12
    pd.testing.assert_frame_equal(pd.read_parquet(again.table), full)


def test_rows_are_the_hydra_jobs_rows(tmp_path):
    """The same configurations as a Hydra `-m` sweep of experiments.coldstart: the same swept columns and the same
    modelled numbers, to the last bit."""
    ovr = ["model=smollm2_135m", "bits_source=uniform", "prompt_tokens=16", "framework=llamacpp,edgeflow"]
    env = {**os.environ, "EDGELLM_PROGRESS": "0"}
    subprocess.run([sys.executable, "-m", "experiments.coldstart", "-m", f"hydra.sweep.dir={tmp_path / 'hydra'}",
                    "write_trace=false", *ovr], cwd=ROOT, check=True, capture_output=True, env=env)
    hyd = build(tmp_path / "hydra").sort_values("sweep.framework").reset_index(drop=True)
    grid = GridSpec(name="pair",
                    factors={"model": ["smollm2_135m"], "bits_source": ["uniform"], "prompt_tokens": [16],
                             "framework": ["llamacpp", "edgeflow"]})
    s = run_sweep(_spec(tmp_path / "batch", grid, workers=1))
    bat = pd.read_parquet(s.table).sort_values("sweep.framework").reset_index(drop=True)
    sweep_cols = sorted(c for c in bat.columns if c.startswith("sweep."))
    assert sweep_cols == sorted(c for c in hyd.columns if c.startswith("sweep.") and c != "sweep.write_trace")
    modelled = sorted(c for c in bat.columns if c.startswith(("modelled.", "input.")))
    assert modelled == sorted(c for c in hyd.columns if c.startswith(("modelled.", "input.")))
    pd.testing.assert_frame_equal(bat[sweep_cols + modelled], hyd[sweep_cols + modelled])


@pytest.mark.parametrize("grid, match", [
    (GridSpec(name="g", factors={"framework": ["edgeflow", "nope"]}), "framework: no option 'nope'"),
    (GridSpec(name="g", factors={"bits": [5.0, 12.0]}), "bits must be in 1..8"),
    (GridSpec(name="g", factors={"bitz": [5.0]}), "bitz: not a setting of coldstart"),
    (GridSpec(name="g", factors={"bits": []}), "grid.factors.bits: must be a non-empty list"),
    (GridSpec(name="g", fixed={"bits": 5.0}, factors={"bits": [4.0]}), "grid.bits: both fixed and a factor"),
])
def test_bad_input_is_an_error_before_any_work(tmp_path, grid, match):
    with pytest.raises(ConfigError, match=match):
        run_sweep(_spec(tmp_path / "x", grid))
    assert not (tmp_path / "x").exists()


def test_command_line_bad_values_are_one_line(tmp_path):
    env = {**os.environ, "EDGELLM_PROGRESS": "0"}
    cases = [["grid=nope"], ["workers=0"], ["grid.factors.framework=[edgeflow,nope]"]]
    try:
        import ray  # noqa: F401
    except ImportError:
        cases.append(["engine=ray"])
    for args in cases:
        r = subprocess.run([sys.executable, "-m", "experiments.sweep", f"out={tmp_path / 'o'}", *args], cwd=ROOT,
                           capture_output=True, text=True, env=env)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), (args, r.stderr)
        assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_ray_engine_gives_the_local_table(tmp_path):
    """engine=ray (the `ray` extra; `make test-slow` requires it, EDGELLM_REQUIRE_EXTRAS=1): the local table."""
    if os.environ.get("EDGELLM_REQUIRE_EXTRAS") == "1":
        import ray  # noqa: F401  - a missing extra fails here instead of skipping
    pytest.importorskip("ray")
    grid = _grid("coldstart_small")
    local = run_sweep(_spec(tmp_path / "local", grid, workers=2))
    ray = run_sweep(_spec(tmp_path / "ray", grid, workers=2, engine="ray"))
    assert ray.ran == 12
    pd.testing.assert_frame_equal(pd.read_parquet(ray.table), pd.read_parquet(local.table))


@pytest.mark.slow
def test_ten_thousand_configurations(tmp_path):
    grid = _grid("coldstart_10k")
    s = run_sweep(_spec(tmp_path / "big", grid, workers=2))
    df = pd.read_parquet(s.table)
    print(f"\n{s.total} configurations in {s.wall_s:.0f} s ({s.wall_s / s.total * 1e3:.1f} ms each, 2 workers)")
    assert (s.total, s.ran, s.failed) == (10_000, 10_000, 0)
    assert len(df) == 10_000 and df["job"].is_unique and (df["modelled.ttft_s"] > 0).all()


@pytest.mark.slow
def test_ctrl_c_is_one_line_and_a_rerun_resumes(tmp_path):
    """Ctrl-C (SIGINT to the process group, as a terminal sends it) mid-sweep: one line, exit 130, the workers
    stopped, finished chunks kept; the same command then runs only the rest and the table is complete."""
    import signal
    import time

    out = tmp_path / "o"
    args = [sys.executable, "-m", "experiments.sweep", "grid=coldstart_small", f"out={out}", "chunk=3",
            "grid.factors.prompt_tokens=[8,16,24,32,40,48,56,64,72,80,88,96]"]
    env = {**os.environ, "EDGELLM_PROGRESS": "0"}
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while not list((out / "parts").glob("part-*.parquet")) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and len(err.strip().splitlines()) == 1, err
    kept = sum(len(pd.read_parquet(p)) for p in (out / "parts").glob("part-*.parquet"))
    assert 0 < kept < 72
    r = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, env=env, check=True)
    assert f"72 configurations, {72 - kept} run, {kept} already done" in r.stdout
    assert len(pd.read_parquet(out / "results.parquet")) == 72
