"""Sweeps beyond one machine (docs/sweeps.md): the Ray launcher (`conf/hydra/launcher/ray_local.yaml`, a local Ray
runtime) and the submitit launcher (`hydra/launcher=submitit_local`, the local executor of the SLURM plugin) run a real
4-job cold-start sweep each and give the same results table as the joblib launcher. Optional extras `[ray]` and
`[slurm]`: skipped without them, except under `make test-slow`, which installs them and sets
EDGELLM_REQUIRE_EXTRAS=1 so that a missing launcher fails instead of skipping."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from experiments import results

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = {"ray": "hydra_plugins.hydra_ray_launcher", "slurm": "hydra_plugins.hydra_submitit_launcher"}
FACTORS = {"framework": ["llamacpp", "edgeflow"], "workload": ["lambada", "obqa"]}
SWEEP = ["-m", "model=smollm2_135m", *(f"{k}={','.join(v)}" for k, v in FACTORS.items()), "write_trace=false"]
DRIVER = """import sys
import hydra
import experiments.coldstart as app
hydra.main(config_path=sys.argv.pop(1), config_name="coldstart", version_base="1.3")(lambda cfg: app.run(cfg))()
"""


def _need(extra: str) -> None:
    """Skip without the extra's launcher plugin; fail instead where the caller requires it (`make test-slow`)."""
    mods = [PLUGINS[extra]] + (["ray"] if extra == "ray" else ["submitit"])
    missing = [m for m in mods if importlib.util.find_spec(m) is None]
    if missing:
        msg = f"{', '.join(missing)} not installed: pip install -e '.[{extra}]' (optional extra)"
        if os.environ.get("EDGELLM_REQUIRE_EXTRAS") == "1":
            pytest.fail(msg)
        pytest.skip(msg)


def _config_dir(tmp: Path) -> Path:
    """conf/coldstart.yaml without its joblib-only `hydra.launcher.n_jobs` (a key other launchers' schemas reject),
    with conf/ on the search path for the config groups."""
    cfg = OmegaConf.load(ROOT / "conf" / "coldstart.yaml")
    cfg.hydra.pop("launcher", None)
    cfg.defaults = [d for d in cfg.defaults if not OmegaConf.is_dict(d) or "override hydra/launcher" not in d]
    cfg.hydra.searchpath = [f"file://{ROOT / 'conf'}"]
    d = tmp / "conf"
    d.mkdir(exist_ok=True)
    (d / "coldstart.yaml").write_text(OmegaConf.to_yaml(cfg))
    return d


def _sweep(tmp: Path, name: str, launcher: list[str]) -> pd.DataFrame:
    """Run the 4-job sweep with `launcher` into tmp/name; every job finished with a metrics.json; the table has one
    row per job and the swept factors as columns."""
    out = tmp / name
    cmd = [sys.executable, "-c", DRIVER, str(_config_dir(tmp)), *SWEEP, *launcher, f"hydra.sweep.dir={out}",
           "hydra.job.name=coldstart"]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    jobs = sorted(m.parent.name for m in out.glob("*/metrics.json"))
    assert len(jobs) == 4, jobs
    df = results.build(out)
    assert len(df) == 4
    for k, v in FACTORS.items():
        assert sorted(set(df[f"sweep.{k}"])) == sorted(v)
    assert df["modelled.ttft_s"].gt(0).all()
    return df.drop(columns=["app"]).sort_values("job", ignore_index=True)


@pytest.fixture(scope="module")
def joblib_table(tmp_path_factory):
    return _sweep(tmp_path_factory.mktemp("joblib"), "sweep", ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"])


@pytest.mark.slow      # starts a local Ray runtime (a few seconds) and runs a 4-job sweep
def test_ray_sweep_matches_joblib(tmp_path, joblib_table):
    _need("ray")
    pd.testing.assert_frame_equal(_sweep(tmp_path, "ray", ["hydra/launcher=ray_local"]), joblib_table)


@pytest.mark.slow      # one Python process per job through submitit's local executor
def test_submitit_local_sweep_matches_joblib(tmp_path, joblib_table):
    _need("slurm")
    got = _sweep(tmp_path, "submitit", ["hydra/launcher=submitit_local", "hydra.launcher.timeout_min=10"])
    assert list((tmp_path / "submitit" / ".submitit").iterdir()), "no submitit job folders"
    pd.testing.assert_frame_equal(got, joblib_table)


@pytest.mark.parametrize("launcher, extra, target", [
    ("ray_local", "ray", "hydra_plugins.hydra_ray_launcher.ray_launcher.RayLauncher"),
    ("slurm", "slurm", "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"),
    ("submitit_local", "slurm", "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher")])
def test_launcher_config_composes(launcher, extra, target):
    _need(extra)
    from hydra import compose, initialize_config_dir

    import experiments.figures.app  # noqa: F401  (registers figures_schema: any app config will do)

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("figures", overrides=[f"hydra/launcher={launcher}"], return_hydra_config=True)
    assert cfg.hydra.launcher._target_ == target
