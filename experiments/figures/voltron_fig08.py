"""Voltron Fig. 8 (§3.2.3, stochastic wireless network): (a) the Wi-Fi Direct RSSI of each link while the user
walks away and back (`conf/trace/walk_away.csv`, synthetic in the paper's shape), the goodput the RSSI table maps it
to (`planner.voltron.rssi`), and (b) the decode TPOT of MP, TP and Voltron over the same trace (Office cluster),
simulated."""
from __future__ import annotations

import numpy as np
import pandas as pd

from experiments.figures.base import FigureSpec, legend, note
from experiments.figures.names import label
from experiments.figures.voltron_data import conversation, gapped, qos_line
from planner.voltron.rssi import RssiTable

GRID = {"full": dict(model="qwen2_5_14b", turns=5, think_s=60.0, every=1),
        "toy": dict(model="qwen2_5_3b", turns=1, think_s=None, every=10)}
CLUSTER, TRACE = "office", "walk_away"

SPEC = FigureSpec(
    name="voltron_fig08", paper="Voltron", figure="Fig. 8",
    topic="Wi-Fi RSSI under user mobility and decode TPOT per planner",
    title="Office cluster, walk-away trace; (b) TPOT over time, where the paper's 8b plots it per signal strength",
    claim="As the user moves, a link's signal strength swings by tens of dBm; communication time swells at weak "
          "signal, so TP's per-layer traffic loses to MP there while TP wins on strong links — the best plan "
          "changes with the network.",
    simulated="RSSI -> goodput (802.11 MCS table) and each planner's decode over the trace",
    tolerances={"value": (1e-4, 1e-9)})


def data(size: str) -> pd.DataFrame:
    g = GRID[size]
    rows = []
    tab = RssiTable()
    res = {p: conversation(CLUSTER, g["model"], p, TRACE, g["turns"], think_s=g["think_s"])
           for p in ("voltron", "mp", "tp")}
    tl = pd.DataFrame(res["voltron"].timeline)
    for c in [c for c in tl.columns if c.startswith("rssi_")]:
        d = tl.iloc[::g["every"]]
        rssi = d[c].to_numpy(float)
        gp = tab.goodput_bps(rssi) / 1e6 * 8                      # Mbit/s
        rows += [{"panel": "a", "series": c[5:], "time_s": t, "metric": "rssi_dbm", "value": v}
                 for t, v in zip(d.time_s, rssi)]
        rows += [{"panel": "a", "series": c[5:], "time_s": t, "metric": "goodput_mbps", "value": v}
                 for t, v in zip(d.time_s, gp)]
    for p, r in res.items():
        d = pd.DataFrame(r.timeline)
        d = d[d.phase == "decode"].iloc[::g["every"]]
        rows += [{"panel": "b", "series": p, "time_s": t, "metric": "tpot_ms", "value": 1e3 * v}
                 for t, v in zip(d.time_s, d.step_s)]
    df = pd.DataFrame(rows)
    df["source"] = "modelled"
    assert np.isfinite(df.time_s).all()
    return df


LINKS = {"link1": "phone ↔ tablet", "link2": "phone ↔ watch"}     # conf/cluster/office.yaml `links`


def plot(df: pd.DataFrame, fig) -> None:
    ax1 = fig.add_subplot(2, 1, 1)
    ax2 = fig.add_subplot(2, 1, 2, sharex=ax1)
    a = df[(df.panel == "a") & (df.metric == "rssi_dbm")]
    for s in dict.fromkeys(a.series):
        d = a[a.series == s]
        ax1.plot(*gapped(d), lw=0.9, label=LINKS.get(s, s))
    ax1.set_ylabel("RSSI (dBm)")
    legend(ax1, title="Office link")
    b = df[df.panel == "b"]
    for s in dict.fromkeys(b.series):
        d = b[b.series == s]
        ax2.plot(d.time_s, d.value, ".", ms=2, label=label(s))
    qos_line(ax2)
    ax2.set_ylim(0, min(2000, float(b.value.max()) * 1.1 if len(b) else 1000))
    ax2.set_xlabel("time (s)")
    ax2.set_ylabel("decode TPOT (ms)")
    legend(ax2, markerscale=4)
    note(fig, "synthetic trace; TPOT simulated")
