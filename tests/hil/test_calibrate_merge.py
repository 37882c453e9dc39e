"""Calibration rounds merged figure by figure (hil.calibrate_merge)."""
from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from hil import calibrate as cal
from hil.calibrate_merge import measure_rounds, merge_rounds
from hil.calibrate_stats import Stat
from tests.conftest import REPO


@dataclasses.dataclass
class _Part:
    stat: Stat
    maybe: Stat | None = None


@dataclasses.dataclass
class _Meas:
    kernels: str
    request: int
    rate: float
    curve: list[dict]
    per_thread: dict[int, Stat]
    part: _Part
    wall_s: dict[str, float]
    loadavg: tuple[float, float, float]


def _round(rate: float, req: int, gemm_s: float, stat_med: float, wall: float) -> _Meas:
    return _Meas("native.compute", req, rate,
                 [dict(m=16, k=576, n=1536, threads=1, seconds=gemm_s, gbps_min=gemm_s / 2, gbps_max=gemm_s * 2)],
                 {1: Stat(stat_med, 0.1, 5), 2: Stat(stat_med / 2, 0.2, 5)}, _Part(Stat(stat_med, 0.05, 9)),
                 {"gemm": wall, "copy": 1.0}, (1.0, 2.0, 3.0))


def test_median_over_rounds_figure_by_figure():
    rounds = [_round(1.0, 4 << 20, 100e-6, 2.0, 10.0), _round(9.0, 1 << 20, 130e-6, 3.0, 11.0),
              _round(2.0, 16 << 20, 300e-6, 10.0, 12.0)]
    m = merge_rounds(rounds)
    assert m.rate == 2.0                                   # one noisy round (9.0) does not move it
    assert m.request == 4 << 20                            # an int stays one of the measured values
    row = m.curve[0]
    assert (row["m"], row["k"], row["n"], row["threads"]) == (16, 576, 1536, 1)
    assert row["seconds"] == 130e-6
    assert row["gbps_min"] == 50e-6 and row["gbps_max"] == 600e-6     # min / max over rounds, not medians
    assert m.per_thread[1].median == 3.0 and m.per_thread[2].median == 1.5
    # spread: the rounds' medians moved (10 - 2) / 3, more than any round's own spread
    assert m.per_thread[1].spread == pytest.approx(8.0 / 3.0) and m.per_thread[1].n == 15
    assert m.part.stat.median == 3.0 and m.part.maybe is None
    assert m.wall_s == {"gemm": 33.0, "copy": 3.0}         # wall time: summed
    assert m.loadavg == (1.0, 2.0, 3.0) and m.kernels == "native.compute"


def test_quiet_rounds_keep_their_own_spread():
    a = Stat(1.0, 0.3, 5)
    m = merge_rounds([a, Stat(1.01, 0.25, 5), Stat(0.99, 0.4, 5)])
    assert m.median == 1.0 and m.spread == pytest.approx(0.3) and m.n == 15


def test_one_round_is_itself_and_even_rounds_take_the_lower_int():
    r = _round(1.0, 4 << 20, 1e-4, 2.0, 1.0)
    assert merge_rounds([r]) == r
    assert merge_rounds([3, 8]) == 3 and merge_rounds([3.0, 8.0]) == 5.5


def test_rounds_of_different_shape_are_refused():
    a, b = _round(1.0, 1, 1e-4, 2.0, 1.0), _round(1.0, 1, 1e-4, 2.0, 1.0)
    b.curve[0]["k"] = 2048                                  # a different GEMM point
    with pytest.raises(ValueError, match=r"curve\[0\]\.k: rounds measured different points"):
        merge_rounds([a, b])
    c = _round(1.0, 1, 1e-4, 2.0, 1.0)
    c.curve.append(dict(c.curve[0]))
    with pytest.raises(ValueError, match="different numbers of points"):
        merge_rounds([a, c])
    d = _round(1.0, 1, 1e-4, 2.0, 1.0)
    d.kernels = "numpy stand-in"
    with pytest.raises(ValueError, match="kernels: rounds disagree"):
        merge_rounds([a, d])
    e = _round(1.0, 1, 1e-4, 2.0, 1.0)
    e.part.maybe = Stat(1.0, 0.0, 1)
    with pytest.raises(ValueError, match="maybe: rounds disagree in type"):
        merge_rounds([a, e])
    with pytest.raises(ValueError, match="no rounds"):
        merge_rounds([])


def test_rounds_setting_is_checked():
    assert cal.CalibrationSettings.make(False).rounds == 3
    assert cal.CalibrationSettings.make(True).rounds == 1
    assert cal.CalibrationSettings.make(True, 2).rounds == 2
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="rounds"):
            cal.CalibrationSettings(rounds=bad)


def test_measure_rounds_merges_every_pass(monkeypatch, tmp_path):
    seen = []

    def fake_measure_all(scratch, s, log):
        seen.append(scratch)
        return _round(float(len(seen)), 1, 1e-4, 1.0, 1.0)

    monkeypatch.setattr(cal, "measure_all", fake_measure_all)
    lines: list[str] = []
    merged, rounds = measure_rounds(tmp_path, cal.CalibrationSettings(rounds=3), lines.append)
    assert len(rounds) == 3 and merged.rate == 2.0 and lines == [f"calibrate: round {i}/3" for i in (1, 2, 3)]


def test_calibrate_app_refuses_bad_rounds():
    for bad in ("rounds=0", "rounds=two"):
        r = subprocess.run([sys.executable, "-m", "experiments.calibrate", bad], cwd=REPO, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 2 and "rounds" in r.stderr and r.stderr.strip().count("\n") == 0, r.stderr


def test_calibrate_app_refuses_a_bad_host_memory_mode():
    r = subprocess.run([sys.executable, "-m", "experiments.calibrate", "host_memory=keep"], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "host_memory" in r.stderr and r.stderr.strip().count("\n") == 0, r.stderr
