"""One line instead of a traceback or a leftover: the figures app's pre-check, results on a malformed sweep, the
emulated cluster's model / trace / context checks before the cluster starts, `+key` for a key nothing reads, a full
disk (exit 2) and Ctrl-C (exit 130) through the apps' entry wrapper, and progress of a long pre-check that never
breaks the one error line."""
from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from experiments import common, results
from experiments.common import one_line_errors, precheck
from tests.badinput.helpers import reject

ROOT = Path(__file__).resolve().parents[2]


def _figures(capsys, argv: list[str]) -> str:
    from experiments.figures.app import validate

    with pytest.raises(SystemExit) as ei:
        precheck("figures", argv, validate)
    err = capsys.readouterr().err
    assert ei.value.code == 2 and err.count("\n") == 1 and err.startswith("error: "), err
    return err


@pytest.mark.parametrize("arg, key", [("figure=nope", "figure"), ("foo=1", "foo"), ("+foo=1", "foo"),
                                      ("progress=maybe", "progress"), ("size=huge", "size"), ("out=", "out")])
def test_figures_precheck(capsys, arg, key):
    assert _figures(capsys, [arg]).startswith(f"error: {key}: ")


def test_plus_key_nothing_reads_is_an_error(capsys):
    reject(capsys, "coldstart", ["+foo=1"], "foo")
    reject(capsys, "multidevice", ["++turnz=3"], "turnz")
    reject(capsys, "validate_cluster", ["+live.speed=3"], "live.speed")


@pytest.mark.parametrize("argv, key, text", [
    (["model=llama3_8b"], "model", "no weights on this machine"),
    (["cluster.links=[link1,linkX]"], "trace", "no samples of link 'linkX'"),
    (["turns=50", "prompt_tokens=256", "new_tokens=256"], "prompt_tokens", "context of 8192 tokens")])
def test_cluster_run_fails_before_the_cluster_starts(capsys, argv, key, text):
    assert text in reject(capsys, "validate_cluster", ["turns=1", *argv], key)


def test_multidevice_trace_links_match_the_cluster(capsys):
    reject(capsys, "multidevice", ["cluster.links=[link1,nolink]"], "trace")


def _sweep(tmp_path: Path, metrics, overrides: str | None = None) -> Path:
    job = tmp_path / "sweep" / "0"
    (job / ".hydra").mkdir(parents=True)
    (job / "metrics.json").write_text(metrics if isinstance(metrics, str) else json.dumps(metrics))
    if overrides is not None:
        (job / ".hydra" / "overrides.yaml").write_text(overrides)
    return tmp_path / "sweep"


@pytest.mark.parametrize("metrics, overrides, text", [
    ([1, 2], None, "must be a JSON object"),
    ({"x": 1, "measured_keys": 5}, None, "measured_keys must be a list"),
    ({"x": 1, "input_keys": [1]}, None, "input_keys must be a list"),
    ({"x": 1}, "- a=1\n  - : [", "overrides.yaml: not valid YAML"),
    ({"x": 1}, "a: 1\n", "must be a list of key=value"),
    ("\xff\xfe", None, "not valid JSON")])
def test_results_on_a_malformed_sweep(tmp_path, capsys, metrics, overrides, text):
    root = _sweep(tmp_path, metrics, overrides)
    assert results.main([str(root)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and text in err, err
    assert not (root / "results.csv").exists()


def test_full_disk_and_ctrl_c_through_the_entry_wrapper(capsys):
    @one_line_errors
    def full(_cfg):
        raise OSError(errno.ENOSPC, "No space left on device", "/x/metrics.json")

    @one_line_errors
    def ctrl_c(_cfg):
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as ei:
        full(None)
    err = capsys.readouterr().err
    assert ei.value.code == 2 and err == ("error: /x/metrics.json: no space left on device (the run directory holds no "
                                          "metrics.json: it is re-run next time)\n")
    with pytest.raises(SystemExit) as ei:
        ctrl_c(None)
    err = capsys.readouterr().err
    assert ei.value.code == 130 and err.count("\n") == 1 and err.startswith("error: interrupted")

    @one_line_errors
    def other(_cfg):
        raise OSError(errno.EACCES, "Permission denied")

    with pytest.raises(OSError):                # not bad input: left to the caller as before
        other(None)


def test_long_precheck_shows_progress_then_one_error_line(capsys, monkeypatch):
    from experiments import coldstart

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    monkeypatch.setattr(common.Progress, "PROGRESS_S", 0.0)
    assert precheck("coldstart", ["-m", "framework=mnn,edgeflow", "prompt_tokens=64,128"], coldstart.validate,
                    coldstart.GROUPS) == 4
    err = capsys.readouterr().err
    assert "\rchecking 3/4 jobs" in err and err.endswith("\r\x1b[K")
    with pytest.raises(SystemExit):
        precheck("coldstart", ["-m", "framework=mnn,edgeflow", "prompt_tokens=64,abc"], coldstart.validate,
                 coldstart.GROUPS)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "\r\x1b[Kerror: prompt_tokens: " in err


def test_ctrl_c_during_the_precheck_is_one_line(capsys, monkeypatch):
    from experiments import coldstart

    def stop(_cfg):
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as ei:
        precheck("coldstart", [], stop, coldstart.GROUPS)
    err = capsys.readouterr().err
    assert ei.value.code == 130 and err.count("\n") == 1 and err.startswith("error: interrupted")


@pytest.mark.slow
def test_figures_bad_input_leaves_no_run_dir(tmp_path):
    for arg in ("figure=nope", "foo=1"):
        r = subprocess.run([sys.executable, "-m", "experiments.figures", arg], cwd=tmp_path, capture_output=True,
                           text=True, timeout=120, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and r.stderr.startswith("error: "), r.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_ctrl_c_of_a_real_run_is_one_line_and_exit_130(tmp_path):
    import signal
    import time

    run = tmp_path / "run"
    p = subprocess.Popen([sys.executable, "-m", "experiments.multidevice", "turns=100", f"hydra.run.dir={run}"],
                         cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))   # as from a terminal
    try:
        deadline = time.monotonic() + 120
        while not (run / ".edgellm-run").exists():               # the run has started its work
            assert p.poll() is None and time.monotonic() < deadline, p.stderr.read() if p.stderr else ""
            time.sleep(0.05)
        time.sleep(0.5)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 130 and err.count("\n") == 1 and err.startswith("error: interrupted"), (p.returncode, err)
    assert not (run / "metrics.json").exists()


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs (root)")
def test_full_disk_of_a_real_run_is_one_line_and_exit_2(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48k", "tmpfs", str(disk)], check=True)
    try:
        r = subprocess.run([sys.executable, "-m", "experiments.coldstart", "model=llama3_8b", "write_trace=true",
                            f"hydra.run.dir={disk / 'r'}"], cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert r.returncode == 2 and r.stderr.count("\n") == 1, (r.returncode, r.stderr[-2000:])
        assert r.stderr.startswith(f"error: {disk / 'r'}: no space left on device"), r.stderr
        assert not (disk / "r" / "metrics.json").exists()
        assert not [p for p in (disk / "r").iterdir() if p.name.endswith(".tmp")]     # no partial file left
    finally:
        subprocess.run(["umount", str(disk)], check=False)


def test_exhausted_link_retries_are_one_line(capsys, monkeypatch, tmp_path):
    """Links falling during one step more than live.max_retries times: one line naming the key (the cluster is
    closed by the run's own `finally`), not a LinkDown traceback."""
    from types import SimpleNamespace

    from experiments import validate_cluster as vc
    from hil.cluster.transport import LinkDown

    def fail_run(inp, out):
        raise LinkDown("device 1: link down")

    import hil.timing

    monkeypatch.setattr(vc, "inputs", lambda cfg: SimpleNamespace(live=SimpleNamespace(max_retries=3),
                                                                   cluster=SimpleNamespace(name="office_emu")))
    monkeypatch.setattr(hil.timing, "lock_path", lambda: tmp_path / "timing.lock")
    monkeypatch.setattr(vc, "run_dir", lambda: tmp_path)
    monkeypatch.setattr(vc, "run", fail_run)
    inner = vc.main.__wrapped__.__wrapped__                  # below Hydra and resume: one_line_errors(main)
    with pytest.raises(SystemExit) as ei:
        inner(None)
    err = capsys.readouterr().err
    assert ei.value.code == 2 and err.count("\n") == 1 and err.startswith("error: live.max_retries: a step failed 4 ")
