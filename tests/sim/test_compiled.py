"""The simulator's compiled modules (setup.py builds every .py with a .pxd beside it with Cython; docs/coldstart.md
"Benchmarks") simulate exactly what their Python sources do — every span of every timeline to the last bit, for every
framework on a phone profile and on the measured host with all its runtime mechanics — and an edited source runs
instead of its stale compiled module (`planner.use_compiled`)."""
from __future__ import annotations

import importlib.machinery
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from planner import PURE_ENV
from tests.conftest import REPO

SIM = REPO / "sim"


def _built(directory: Path) -> list[str]:
    return sorted(p.stem for p in directory.glob("*.pxd")
                  if any((directory / (p.stem + s)).exists() for s in importlib.machinery.EXTENSION_SUFFIXES))


needs_build = pytest.mark.skipif(not _built(SIM), reason="no compiled modules (setup.py ran without Cython)")

# Every framework's timeline on a phone (shared cores and DRAM) and on the host (interpreter lock, wake-up packing,
# co-running, readahead), hashed span by span with the timeline's totals and samples.
_FINGERPRINT = r"""
import hashlib, json, sys
import planner.pipeline, sim
from hil.deploy import fit_threads
from planner.cost import AnalyticCostModel
from planner.device import SocProfile
from planner.framework import FrameworkSpec
from planner.host_runtime import HostRuntime
from quant.arch import ModelSpec
from sim import engine, executor, sharing
from sim.coldstart import POLICIES, ColdStartInputs
from sim.coldstart.sweep import ALL_FRAMEWORKS, load_conf

def digest(tl):
    h = hashlib.sha256()
    for s in tl.spans:
        h.update(repr((s.task, s.resource, s.worker, s.start, s.end, s.unit, s.stolen, s.cpu_s)).encode())
    h.update(repr((tl.end_s, tl.bytes_read, tl.peak_mem_bytes, tl.core_busy_s, tl.waits, tl.waits_by_thread,
                   tl.packed_wakes, tl.flash_samples, tl.mem_samples)).encode())
    return h.hexdigest()

out = {}
phone = load_conf("device", "xiaomi15pro", SocProfile)
llama = load_conf("model", "llama3_8b", ModelSpec)
for name in ALL_FRAMEWORKS:
    fw = load_conf("framework", name, FrameworkSpec)
    x = ColdStartInputs(llama, phone, fw, AnalyticCostModel(phone), 256, 5.0, bits_source="uniform")
    out["phone/" + name] = digest(executor.simulate(POLICIES[fw.policy]().build(x), phone, x.cost))
doc = json.load(open(sys.argv[1]))
dev, rt = SocProfile(**doc["device"]), HostRuntime(**doc["runtime"])
smol = load_conf("model", "smollm2_135m", ModelSpec)
for name in ALL_FRAMEWORKS:
    fw = fit_threads(load_conf("framework", name, FrameworkSpec), dev, rt)
    x = ColdStartInputs(smol, dev, fw, AnalyticCostModel(dev), 64, 5.0, bits_source="uniform")
    out["host/" + name] = digest(executor.simulate(POLICIES[fw.policy]().build(x), dev, x.cost, runtime=rt))
files = {m.__name__: m.__file__ for m in (engine, sharing, executor, planner.pipeline.dispatch)}
print(json.dumps({"compiled": [sim.COMPILED, planner.pipeline.COMPILED], "files": files, "timelines": out}))
"""


def _run(script: str, *args: str, cwd: Path = REPO, pure: bool = False) -> tuple[dict, str]:
    env = {k: v for k, v in os.environ.items() if k != PURE_ENV}
    if pure:
        env[PURE_ENV] = "1"
    r = subprocess.run([sys.executable, "-W", "always", "-c", script, *args], cwd=cwd, env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


@needs_build
def test_compiled_and_python_sources_simulate_the_same_timelines():
    golden = str(REPO / "tests" / "sim" / "golden" / "host_profile.json")
    compiled, _ = _run(_FINGERPRINT, golden)
    pure, _ = _run(_FINGERPRINT, golden, pure=True)
    assert compiled["compiled"] == [True, False], compiled["files"]
    # the dispatcher is the HIL runner's too: it runs from its source, so the measured runtime does not depend on
    # the build
    assert compiled["files"].pop("planner.pipeline.dispatch").endswith(".py")
    assert all(not f.endswith(".py") for f in compiled["files"].values()), compiled["files"]
    assert pure["compiled"] == [False, False]
    assert all(f.endswith(".py") for f in pure["files"].values()), pure["files"]
    assert len(compiled["timelines"]) == 2 * len(set(k.split("/")[1] for k in compiled["timelines"]))
    assert compiled["timelines"] == pure["timelines"]


_IMPORT = r"""
import json
import sim, sim.engine, sim.sharing
print(json.dumps({"compiled": sim.COMPILED, "engine": sim.engine.__file__, "sharing": sim.sharing.__file__}))
"""


@needs_build
def test_an_edited_source_runs_instead_of_its_stale_compiled_module(tmp_path):
    shutil.copytree(SIM, tmp_path / "sim", ignore=shutil.ignore_patterns("__pycache__", "coldstart"))
    (tmp_path / "planner").mkdir()
    shutil.copy(REPO / "planner" / "__init__.py", tmp_path / "planner" / "__init__.py")
    fresh, err = _run(_IMPORT, cwd=tmp_path)
    assert fresh["compiled"] is True and not fresh["engine"].endswith(".py"), (fresh, err)
    assert Path(fresh["engine"]).parent == tmp_path / "sim" and "not built from" not in err
    with open(tmp_path / "sim" / "sharing.py", "a") as f:       # an edit the build has not seen
        f.write("\nEDITED = True\n")
    stale, err = _run(_IMPORT, cwd=tmp_path)
    assert stale["compiled"] is False, stale
    # the whole group runs from its sources (sharing uses engine's C declarations)
    assert stale["engine"] == str(tmp_path / "sim" / "engine.py")
    assert stale["sharing"] == str(tmp_path / "sim" / "sharing.py")
    assert "sim: compiled sharing not built from the current sources" in err, err


@needs_build
def test_a_missing_compiled_module_runs_the_sources(tmp_path):
    shutil.copytree(SIM, tmp_path / "sim", ignore=shutil.ignore_patterns("__pycache__", "coldstart"))
    (tmp_path / "planner").mkdir()
    shutil.copy(REPO / "planner" / "__init__.py", tmp_path / "planner" / "__init__.py")
    for so in (tmp_path / "sim").glob("engine.*.so"):         # one module not built: the group runs its sources
        so.unlink()
    part, err = _run(_IMPORT, cwd=tmp_path)
    assert part["compiled"] is False and part["sharing"] == str(tmp_path / "sim" / "sharing.py"), part
    assert "sim: compiled engine not built from the current sources" in err, err
    for so in (tmp_path / "sim").glob("*.so"):                # nothing built (no Cython at install): silently
        so.unlink()
    none, err = _run(_IMPORT, cwd=tmp_path)
    assert none["compiled"] is False and none["engine"] == str(tmp_path / "sim" / "engine.py"), none
    assert "not built from" not in err, err


@needs_build
def test_a_compiled_module_without_its_pxd_runs_its_source(tmp_path):
    """An extension module left from a build whose .pxd is gone (a checkout, a module dropped from the compiled set)
    still shadows its .py: the package runs from its sources (the modules use each other's C declarations), with a
    warning."""
    shutil.copytree(SIM, tmp_path / "sim", ignore=shutil.ignore_patterns("__pycache__", "coldstart"))
    (tmp_path / "planner").mkdir()
    shutil.copy(REPO / "planner" / "__init__.py", tmp_path / "planner" / "__init__.py")
    (tmp_path / "sim" / "sharing.pxd").unlink()
    res, err = _run(_IMPORT, cwd=tmp_path)
    assert res["compiled"] is False and res["sharing"] == str(tmp_path / "sim" / "sharing.py"), (res, err)
    assert res["engine"] == str(tmp_path / "sim" / "engine.py"), res
    assert "sim: compiled sharing has no .pxd" in err, err
