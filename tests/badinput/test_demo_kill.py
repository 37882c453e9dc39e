"""Killing `make demo` (even with SIGKILL) leaves none of its child apps running."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from tests.conftest import REPO

SLEEPER = """
import os, sys, time
open(sys.argv[1], "w").write(str(os.getpid()))
time.sleep(60)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"          # a zombie has exited
    except FileNotFoundError:
        return False


def test_sigkilled_demo_leaves_no_child_app(tmp_path):
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    pid_file = tmp_path / "child.pid"
    driver = ("import sys; from pathlib import Path; from experiments import demo; "
              f"demo._app('sleeper', Path({str(tmp_path / 'run')!r}), [{str(pid_file)!r}])")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}:{REPO}"}
    parent = subprocess.Popen([sys.executable, "-c", driver], cwd=REPO, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not (pid_file.is_file() and pid_file.read_text()) and time.monotonic() < deadline:
            assert parent.poll() is None, "the demo driver ended before starting its child"
            time.sleep(0.05)
        child = int(pid_file.read_text())
        assert _alive(child)
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child), f"child app {child} still running after the demo was killed"
    finally:
        if parent.poll() is None:
            parent.kill()
        if pid_file.is_file() and pid_file.read_text() and _alive(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
