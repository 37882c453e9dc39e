"""Sweeps beyond one machine (docs/sweeps.md): the Ray launcher (`conf/hydra/launcher/ray_local.yaml`, a local Ray
runtime) gives the same results table as the joblib launcher. Optional extra `[ray]`; skipped without it."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from experiments import results

ROOT = Path(__file__).resolve().parents[1]
HAVE_RAY = all(importlib.util.find_spec(m) is not None for m in ("ray", "hydra_plugins.hydra_ray_launcher"))
SWEEP = ["-m", "model=smollm2_135m", "framework=llamacpp,edgeflow", "workload=lambada,obqa", "write_trace=false"]
DRIVER = """import sys
import hydra
import experiments.coldstart as app
hydra.main(config_path=sys.argv.pop(1), config_name="coldstart", version_base="1.3")(lambda cfg: app.run(cfg))()
"""


def _config_dir(tmp: Path) -> Path:
    """conf/coldstart.yaml without its joblib-only `hydra.launcher.n_jobs` (a key other launchers' schemas reject),
    with conf/ on the search path for the config groups."""
    cfg = OmegaConf.load(ROOT / "conf" / "coldstart.yaml")
    cfg.hydra.pop("launcher", None)
    cfg.defaults = [d for d in cfg.defaults if not (isinstance(d, (dict,)) or OmegaConf.is_dict(d))
                    or "override hydra/launcher" not in d]
    cfg.hydra.searchpath = [f"file://{ROOT / 'conf'}"]
    d = tmp / "conf"
    d.mkdir()
    (d / "coldstart.yaml").write_text(OmegaConf.to_yaml(cfg))
    return d


def _sweep(conf: Path, out: Path, launcher: list[str]) -> pd.DataFrame:
    cmd = [sys.executable, "-c", DRIVER, str(conf), *SWEEP, *launcher, f"hydra.sweep.dir={out}",
           "hydra.job.name=coldstart"]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    return results.build(out)


@pytest.mark.slow      # starts a local Ray runtime (~5-10 s) and runs two 4-job sweeps
@pytest.mark.skipif(not HAVE_RAY, reason="Ray launcher not installed: pip install -e '.[ray]' (optional extra)")
def test_ray_results_identical_to_joblib(tmp_path):
    conf = _config_dir(tmp_path)
    a = _sweep(conf, tmp_path / "joblib", ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"])
    b = _sweep(conf, tmp_path / "ray", ["hydra/launcher=ray_local"])
    assert len(a) == 4
    pd.testing.assert_frame_equal(a.drop(columns=["app"]), b.drop(columns=["app"]))


@pytest.mark.parametrize("launcher, plugin, target", [
    ("ray_local", "hydra_plugins.hydra_ray_launcher", "hydra_plugins.hydra_ray_launcher.ray_launcher.RayLauncher"),
    ("slurm", "hydra_plugins.hydra_submitit_launcher",
     "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher")])
def test_launcher_config_composes(launcher, plugin, target):
    if importlib.util.find_spec(plugin) is None:
        pytest.skip(f"{plugin} not installed (optional extra: pip install -e '.[{launcher.split('_')[0]}]')")
    from hydra import compose, initialize_config_dir

    import experiments.figures.app  # noqa: F401  (registers figures_schema: any app config will do)

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("figures", overrides=[f"hydra/launcher={launcher}"], return_hydra_config=True)
    assert cfg.hydra.launcher._target_ == target
