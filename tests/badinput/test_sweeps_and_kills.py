"""Bad input — sweeps and kills: a bad value anywhere in a `-m` list stops before the first job; an empty
group value gives one line; a killed run's leftovers are cleaned and never count as finished; joblib workers exit when
the main process is killed; a rejected run leaves nothing behind."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from experiments import coldstart, multidevice
from experiments.common import precheck, prepare_run_dir
from experiments.resume import finished
from quant.atomic import atomic_open

ROOT = Path(__file__).resolve().parents[2]


def run_precheck(capsys, app, argv, **kw):
    with pytest.raises(SystemExit) as ei:
        precheck(app.__name__.split(".")[-1], argv, app.validate, app.GROUPS, **kw)
    err = capsys.readouterr().err
    assert ei.value.code == 2 and err.count("\n") == 1 and err.startswith("error: "), err
    return err


def test_bad_value_anywhere_in_a_sweep_stops_before_the_first_job(capsys):
    err = run_precheck(capsys, coldstart, ["-m", "framework=mnn,edgeflow", "prompt_tokens=64,128,abc"])
    assert err.startswith("error: prompt_tokens: ") and "sweep job #2" in err
    err = run_precheck(capsys, multidevice, ["-m", "turns=1,2", "jitter=0.1,nan"])
    assert err.startswith("error: jitter: ")
    assert precheck("coldstart", ["-m", "framework=mnn,edgeflow", "prompt_tokens=64,128"], coldstart.validate,
                    coldstart.GROUPS) == 4                           # every job composed and checked


def test_list_without_multirun_and_empty_group_value_are_one_line(capsys):
    assert run_precheck(capsys, coldstart, ["bits=4,5"]).startswith("error: bits: ")
    for argv in (["framework="], ["-m", "framework="], ["framework=", "bits=4"]):
        assert run_precheck(capsys, coldstart, argv).startswith("error: framework: empty value; use one of: ")
    assert run_precheck(capsys, multidevice, ["cluster="]).startswith("error: cluster: empty value")


def test_hydra_errors_become_one_line_naming_the_key(capsys):
    assert run_precheck(capsys, coldstart, ["foo=1"]).startswith("error: foo: ")
    assert run_precheck(capsys, coldstart, ["model.n_layers=abc"]).startswith("error: model.n_layers: ")


def test_killed_run_leftovers_are_cleaned_and_never_count_as_finished(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    (d / ".edgellm-run").write_text("")                              # the killed run had marked its directory
    (d / "trace.json").write_text("{}")                              # trace written, metrics.json never was
    with pytest.raises(KeyboardInterrupt):                          # a partial atomic write, as after SIGKILL
        with atomic_open(d / "trace.json") as f:
            f.write(b"{")
            raise KeyboardInterrupt
    tmp = d / ".trace.json.abc123.tmp"
    tmp.write_text("{")                                              # what SIGKILL leaves (no cleanup ran)
    assert not finished(d)
    from sim.coldstart.sweep import collect
    with pytest.raises(FileNotFoundError):                           # the collector counts no unfinished run
        collect(tmp_path)
    removed = prepare_run_dir(d, ["trace.json"])
    assert {p.name for p in removed} == {".trace.json.abc123.tmp", "trace.json"}
    assert [p.name for p in d.iterdir()] == [".edgellm-run"]
    (d / "metrics.json").write_text('{"measured_keys": [], "modelled_keys": [], "input_keys": []}')
    assert finished(d)
    prepare_run_dir(d)                                               # a re-run starts unfinished
    assert not finished(d)


def test_rejected_run_leaves_nothing_behind(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for app, arg in (("coldstart", "prompt_tokens=-5"), ("multidevice", "timeline=abc"),
                     ("coldstart", "framework=")):
        p = subprocess.run([sys.executable, "-m", f"experiments.{app}", arg], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 2 and p.stderr.count("\n") == 1 and p.stderr.startswith("error: "), p.stderr
        assert list(tmp_path.iterdir()) == [], list(tmp_path.rglob("*"))


WORKER = """
import os, sys, time
sys.path.insert(0, {root!r})
os.environ["EDGELLM_APP_PID"] = str(os.getpid())
from joblib import Parallel, delayed

def job(i):
    from experiments.common import watch_parent
    watch_parent(poll_s=0.1)
    sys.stdout.write(f"{{os.getpid()}}\\n")      # one write: two workers' lines never interleave in the pipe
    sys.stdout.flush()
    time.sleep(600)

Parallel(n_jobs=2)(delayed(job)(i) for i in range(2))
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:                                                             # a zombie has exited
        return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] != "Z"
    except OSError:
        return False


def test_joblib_workers_exit_when_the_main_process_is_killed(tmp_path):
    main = subprocess.Popen([sys.executable, "-c", WORKER.format(root=str(ROOT))], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(main.stdout.readline()) for _ in range(2)]
        assert all(_alive(p) for p in pids) and main.pid not in pids
        os.kill(main.pid, signal.SIGKILL)
        main.wait()
        deadline = time.monotonic() + 60                             # a bound, not a timing threshold
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(_alive(p) for p in pids)
    finally:
        if main.poll() is None:
            main.kill()
