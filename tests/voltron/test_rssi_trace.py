"""RSSI table (IEEE 802.11 sensitivities), trace loading and its one-line errors."""
from __future__ import annotations

import numpy as np
import pytest

from planner.voltron.rssi import RssiTable
from sim.wireless import RssiTrace, TraceConfig, synth_trace, write_trace


def test_table_monotone_and_disconnects():
    t = RssiTable()
    r = np.arange(-95, -30, 0.5)
    gp, lat = t.goodput_bps(r), t.latency_s(r)
    assert (np.diff(gp) >= 0).all()                                   # stronger signal never slower
    assert (gp[r < t.disconnect_dbm] == 0).all() and np.isinf(lat[r < t.disconnect_dbm]).all()
    assert t.mcs(-54) == 9 and t.mcs(-79) == 0                        # 40 MHz: 20 MHz table + 3 dB
    assert t.goodput_bps(-40) == pytest.approx(360e6 / 8 * 0.6)


def test_trace_sample_and_hold(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("time_s,link,dbm\n0,link1,-40\n10,link1,-70\n0,link2,-50\n")
    tr = RssiTrace.load(TraceConfig(name="t", csv=str(p)))
    assert tr.rssi(["link1", "link2"], 5.0).tolist() == [-40, -50]
    assert tr.rssi(["link1"], 10.0).tolist() == [-70]
    with pytest.raises(ValueError, match="no link 'link3'"):
        tr.rssi(["link3"], 0.0)


@pytest.mark.parametrize("body,msg", [("time_s,link\n0,l\n", "header"), ("time_s,link,dbm\n0,l,abc\n", ":2:"),
                                      ("time_s,link,dbm\n0,l,-40\n0,l,-41\n", "strictly increasing"),
                                      ("time_s,link,dbm\n0,l,20\n", ":2:")])
def test_malformed_trace_one_line(tmp_path, body, msg):
    p = tmp_path / "bad.csv"
    p.write_text(body)
    with pytest.raises(ValueError, match=msg) as e:
        RssiTrace.load(TraceConfig(name="bad", csv=str(p)))
    assert "\n" not in str(e.value)


def test_missing_trace_file():
    with pytest.raises(FileNotFoundError, match="nope.csv"):
        RssiTrace.load(TraceConfig(name="x", csv="nope.csv"))


def test_shipped_traces_are_regenerable(tmp_path):
    from sim.wireless import TRACE_DIR

    for k in ("steady_strong", "walk_away", "walk_away_disconnect"):
        write_trace(tmp_path / f"{k}.csv", synth_trace(k))
        assert (tmp_path / f"{k}.csv").read_text() == (TRACE_DIR / f"{k}.csv").read_text()
    tr = RssiTrace.load(TraceConfig(name="w", csv="walk_away_disconnect.csv"))
    r = np.array([tr.rssi(["link1"], t)[0] for t in range(0, 900, 5)])
    assert r[:10].mean() > -50 and (r < RssiTable().disconnect_dbm).any() and r[-5:].mean() > -50
