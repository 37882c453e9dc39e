"""Every app, as a user runs it (`python -m experiments.<app> …` from a directory of their own), on a table of bad
inputs: exit 2 (Ctrl-C: 130), exactly one line on stderr naming the key, nothing written in the working directory or
anywhere else (each case is a separate process: slow tier)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CASES = [
    ("quantize", ["bits=nan"], "bits"),
    ("quantize", ["model.name=../x"], "model.name"),
    ("quantize", ["pack=maybe"], "pack"),
    ("coldstart", ["+foo=1"], "foo"),
    ("coldstart", ["framework.name=/../../x"], "framework.name"),
    ("coldstart", ["prompt_tokens=inf"], "prompt_tokens"),
    ("multidevice", ["timeline=maybe"], "timeline"),
    ("multidevice", ["trace.name=a/b"], "trace.name"),
    ("multidevice", ["rssi.channel_mhz=1e300"], "rssi.channel_mhz"),
    ("calibrate", ["rounds=nan"], "rounds"),
    ("validate", ["framework.name=.."], "framework.name"),
    ("validate", ["cluster=office_emu", "turns=1", "live.trace_speed=nan"], "live.trace_speed"),
    ("validate", ["cluster=office_emu", "turns=1", "trace.name=/../../../../tmp/victim"], "trace.name"),
    ("validate", ["cluster=office_emu", "model=llama3_8b"], "model"),
    ("calibrate", ["cluster=office_emu", "cluster.name="], "cluster.name"),
    ("calibrate", ["cluster=office_emu", "cluster.emulation.max_cores=nan"], "cluster.emulation.max_cores"),
    ("figures", ["figure=nope"], "figure"),
    ("figures", ["foo=1"], "foo"),
    ("demo", ["multidevice.turns=nan"], "multidevice.turns"),
]


@pytest.mark.slow
@pytest.mark.parametrize("app, argv, key", CASES, ids=[f"{a}-{' '.join(v)}" for a, v, _ in CASES])
def test_bad_input_of_every_app(tmp_path, app, argv, key):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    before = sorted(os.listdir(ROOT / "outputs")) if (ROOT / "outputs").is_dir() else []
    r = subprocess.run([sys.executable, "-m", f"experiments.{app}", *argv], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert r.stderr.count("\n") == 1 and r.stderr.startswith(f"error: {key}"), r.stderr
    assert list(tmp_path.iterdir()) == []
    after = sorted(os.listdir(ROOT / "outputs")) if (ROOT / "outputs").is_dir() else []
    assert after == before
