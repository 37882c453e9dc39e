"""Names that become paths: every config key named `name` and every key a run-directory template interpolates
(`hydra.run.dir` / `hydra.sweep.dir` / `hydra.sweep.subdir`) goes through the model.name rule (`check_name`) in every
app's pre-check, so `trace.name=/../../<victim>` cannot move a run (and its start-of-run clean-up) outside outputs/;
the cluster profile store checks its names again; a run never deletes a user's hidden temp files."""
from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from experiments.common import CONF_DIR, HYDRA_DIR_KEYS, dir_template_keys, path_name_keys, prepare_run_dir
from tests.badinput.helpers import reject

ROOT = Path(__file__).resolve().parents[2]
APPS = ["quantize", "coldstart", "multidevice", "calibrate", "validate", "demo", "validate_cluster",
        "calibrate_cluster"]
# Path-like keys that are not names: each one's reason it may hold a path.
NOT_NAMES = {
    "trace.csv": "input file, only read (sim.wireless.RssiTrace.load checks it)",
    "trace.squeeze_csv": "input file, only read (sim.multidevice.squeeze checks it)",
    "model.gguf_file": "checked by the model.name rule in ModelSpec (tests/badinput/test_paths.py)",
    "profile_dir": "a directory the user names for the profile store; the store's own name is checked inside it",
    "out_dir": "demo: the directory the user names for the demo's outputs",
    "out": "figures: the directory the user names for the figures",
}


def _composed(app: str) -> DictConfig:
    importlib.import_module(f"experiments.{app}")               # registers the app's schemas
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name=app, return_hydra_config=True)


def _walk(node, prefix=""):
    if isinstance(node, DictConfig):
        for k in node.keys():
            key = f"{prefix}.{k}" if prefix else str(k)
            if key == "hydra":
                continue
            yield key
            if not OmegaConf.is_missing(node, k) and not OmegaConf.is_interpolation(node, k):
                yield from _walk(node._get_node(k), key)


def _path_keys(app: str) -> tuple[list[str], list[str]]:
    """(keys to validate as names, other path-like keys) of an app's composed config, found independently of the
    code under test: the interpolations in the composed Hydra directories and every key ending in name/dir/path/file."""
    cfg = _composed(app)
    hydra = OmegaConf.to_container(cfg.hydra, resolve=False)
    templates = [hydra[k.split(".")[1]].get(k.split(".")[2]) for k in HYDRA_DIR_KEYS]
    names = set(dir_template_keys(templates))
    other = set()
    for key in _walk(cfg):
        last = key.rsplit(".", 1)[-1]
        if last == "name" or last.endswith("_name"):
            names.add(key)
        elif re.search(r"(^|_)(dir|path|file|csv|out)$", last) and key not in names \
                and not isinstance(OmegaConf.select(cfg, key), (int, float)):
            other.add(key)
    return sorted(names), sorted(other)


@pytest.mark.parametrize("app", APPS)
def test_every_path_valued_key_of_every_app_is_checked(capsys, app):
    names, other = _path_keys(app)
    assert set(names) <= set(path_name_keys(_composed(app), _templates(app)))
    assert not set(other) - set(NOT_NAMES), f"{app}: path-like keys with no rule: {set(other) - set(NOT_NAMES)}"
    numeric = {"bits", "prompt_tokens"}                         # `b${bits}`: a number (the app's range check)
    for key in names:
        if key in numeric:
            continue
        for bad in ("/../../../../tmp/escape", "a/b", "", ".."):
            reject(capsys, app, [f"{key}={bad}"], key)


def _templates(app: str) -> list[str]:
    from experiments.common import run_dir_templates

    return run_dir_templates(app)


def test_templates_include_the_command_line():
    from experiments.common import run_dir_templates

    t = run_dir_templates("coldstart", ["hydra.run.dir=outputs/x_${trace.name}"])
    assert "trace.name" in dir_template_keys(t) and "framework.name" in dir_template_keys(t)


def test_validate_cluster_trace_name_and_calibrate_cluster_name(capsys):
    reject(capsys, "validate_cluster", ["turns=1", "trace.name=/../../../../../../../../tmp/victim"], "trace.name")
    reject(capsys, "calibrate_cluster", ["cluster.name=/../../../../tmp/esc"], "cluster.name")
    reject(capsys, "calibrate_cluster", ["cluster.name="], "cluster.name")
    reject(capsys, "validate_cluster", ["-m", "trace.name=walk_away,../x"], "trace.name")


def test_profile_store_names_are_checked(tmp_path):
    from hil.cluster.session import ProfileStore
    from planner.voltron.devices import Cluster, ClusterSpec, load_device

    def store(name: str, model: str = "smollm2_135m"):
        spec = ClusterSpec(name=name, devices=["pixel5"], links=[])
        return ProfileStore(Cluster(spec, [load_device("pixel5")]), np.array([0.5]), model, tmp_path)

    assert store("office_emu").dir.parent == tmp_path.resolve()
    for bad in ("", "/../../esc", "a/b", "..", ".hidden"):
        with pytest.raises(ValueError, match="cluster.name"):
            store(bad)
    with pytest.raises(ValueError, match="model.name"):
        store("ok", "../m")
    assert list(tmp_path.iterdir()) == []


def test_a_run_never_replaces_the_files_of_a_users_directory(tmp_path):
    from experiments.common import ConfigError

    user = tmp_path / "mine"
    user.mkdir()
    (user / "config.yaml").write_text("theirs")
    with pytest.raises(ConfigError, match="hydra.run.dir: .* not a run directory of this project"):
        prepare_run_dir(user, ["config.yaml"])
    assert (user / "config.yaml").read_text() == "theirs" and [p.name for p in user.iterdir()] == ["config.yaml"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert prepare_run_dir(empty, ["config.yaml"]) == [] and (empty / ".edgellm-run").is_file()


def test_a_run_never_removes_the_users_hidden_temp_files(tmp_path):
    (tmp_path / ".edgellm-run").write_text("")                   # a run directory of the project
    user = [tmp_path / ".x.tmp", tmp_path / ".notes.ab12cd.tmp", tmp_path / "notes.txt"]
    ours = [tmp_path / ".metrics.json.k3j4h5.tmp", tmp_path / ".steps.csv.q1w2e3.tmp", tmp_path / "steps.csv"]
    for p in user + ours:
        p.write_text("x")
    removed = prepare_run_dir(tmp_path, ["steps.csv"])
    assert sorted(removed) == sorted(ours)
    assert all(p.exists() for p in user)


@pytest.mark.slow
def test_traversal_through_the_app_changes_nothing(tmp_path):
    """The reported case end to end: exit 2, one line, the victim directory untouched, no run directory made."""
    victim = tmp_path / "victim"
    victim.mkdir()
    files = {n: n for n in ("config.yaml", "trace.json", "steps.csv", ".keep.abc123.tmp")}
    for n, text in files.items():
        (victim / n).write_text(text)
    depth = "/".join([".."] * 12)
    before = set(os.listdir(ROOT / "outputs")) if (ROOT / "outputs").is_dir() else set()
    r = subprocess.run([sys.executable, "-m", "experiments.validate", "cluster=office_emu", "turns=1",
                        f"trace.name=/{depth}{victim}"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and r.stderr.startswith("error: trace.name: "), r.stderr
    assert {p.name: p.read_text() for p in victim.iterdir()} == files
    after = set(os.listdir(ROOT / "outputs")) if (ROOT / "outputs").is_dir() else set()
    assert after == before
