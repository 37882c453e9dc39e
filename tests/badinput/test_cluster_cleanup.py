"""Cluster clean-up acts on the project's own state records only: a namespace / cgroup that merely looks like ours
(`efc4000000zz`) survives; a dead owner's recorded set is removed, but a record's entries without its prefix are not
(`python -m experiments.cleanup`). Needs root and iproute2; everything created here is removed."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from experiments import cleanup
from hil.cluster import cgroup
from hil.cluster.netns import _netns_list, cleanup_stale, have_tools

pytestmark = pytest.mark.skipif(have_tools() is not None, reason=str(have_tools()))


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


@pytest.fixture
def namespaces():
    made: list[str] = []

    def add(name: str) -> str:
        subprocess.run(["ip", "netns", "add", name], check=True)
        made.append(name)
        return name

    yield add
    present = set(_netns_list())
    for n in made:
        if n in present:
            subprocess.run(["ip", "netns", "del", n], check=False)


def test_a_lookalike_namespace_is_not_ours(tmp_path, namespaces):
    ns = namespaces("efc4000000zz")
    assert cleanup_stale(tmp_path / "state") == []
    assert ns in _netns_list()


def test_only_a_dead_owners_recorded_entries_are_removed(tmp_path, namespaces, capsys):
    pid = _dead_pid()
    prefix = f"efc{pid}zz"
    ours = namespaces(f"{prefix}-d0")
    lookalike = namespaces(f"efc{pid}zy-d0")                   # same dead pid, in no record
    foreign = namespaces("h7foreign")                          # listed in the record, but not with its prefix
    scratch, users = tmp_path / f"{prefix}-logs", tmp_path / "users"
    scratch.mkdir()
    users.mkdir()
    ctl = cgroup.detect_cpu_controller()
    cg = None
    if ctl is not None:
        cg = ctl.root / f"{prefix}-d0"
        cg.mkdir()
    sdir = tmp_path / "state"
    sdir.mkdir()
    (sdir / f"{prefix}.json").write_text(json.dumps({
        "pid": pid, "start_time": 1, "prefix": prefix, "subnet_x": 200,
        "namespaces": [ours, foreign], "root_links": ["lo", f"{prefix}r"],
        "cgroups": [f"{prefix}-d0", ".."], "pids": [[1, None]], "paths": [str(scratch), str(users), "/"]}))
    try:
        assert cleanup.run(dry_run=True, sdir=sdir) == [prefix]
        assert ours in _netns_list() and scratch.exists()          # a dry run changes nothing
        assert cleanup.run(sdir=sdir) == [prefix]
        present = _netns_list()
        assert ours not in present and lookalike in present and foreign in present
        assert not scratch.exists() and users.exists() and not (sdir / f"{prefix}.json").exists()
        assert cg is None or not cg.exists()
        out = capsys.readouterr().out
        assert f"would remove {prefix}" in out and "1 stale cluster set(s) removed" in out
    finally:
        if cg is not None and cg.exists():
            cg.rmdir()


def test_cleanup_command_line():
    r = subprocess.run([sys.executable, "-m", "experiments.cleanup", "--bogus"], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.startswith("error: --bogus: unknown argument") and r.stderr.count("\n") == 1
