"""Counterpart of Voltron's evaluation: Voltron adapting over time — decode TPOT, the accuracy proxy, the
precision mix (sublayers at FP16 / INT8 / INT4) and the sublayers run as TP while the tablet's link weakens,
disconnects and returns (trace `walk_away_disconnect`, Office cluster), against static MP and TP; simulated. The
paper's evaluation figures are withheld from the design text."""
from __future__ import annotations

import pandas as pd

from experiments.figures.base import FigureSpec, legend, note
from experiments.figures.names import label
from experiments.figures.voltron_data import conversation, gapped, qos_line

GRID = {"full": dict(model="qwen2_5_14b", turns=5, think_s=60.0, every=1),
        "toy": dict(model="qwen2_5_3b", turns=1, think_s=None, every=10)}
CLUSTER, TRACE = "office", "walk_away_disconnect"
SERIES = ("step_s", "accuracy", "n_fp16", "n_int8", "n_int4", "n_tp", "connected")

SPEC = FigureSpec(
    name="voltron_fig12", paper="Voltron", figure="", withheld=True,
    topic="Voltron adapting over time: TPOT, precision mix, TP use and accuracy",
    title="Office cluster, walk-away trace with a disconnect; static MP and TP beside it",
    claim="When the KV cache grows, the signal weakens or a device leaves, Voltron lowers precision, moves layers "
          "between MP and TP and prunes shards within milliseconds, then restores them when conditions improve, "
          "while static plans stall or break QoS.",
    simulated="token-by-token decode of Voltron, MP and TP over the trace",
    tolerances={"value": (1e-4, 1e-9)})


def data(size: str) -> pd.DataFrame:
    g = GRID[size]
    rows = []
    for p in ("voltron", "mp", "tp"):
        tl = pd.DataFrame(conversation(CLUSTER, g["model"], p, TRACE, g["turns"], think_s=g["think_s"]).timeline)
        d = tl[tl.phase == "decode"].iloc[::g["every"]] if len(tl) else tl
        keys = SERIES if p == "voltron" else ("step_s",)
        for k in keys:
            rows += [{"planner": p, "time_s": t, "metric": k, "value": float(v)} for t, v in zip(d.time_s, d[k])]
    df = pd.DataFrame(rows)
    df["source"] = "modelled"
    return df


def plot(df: pd.DataFrame, fig) -> None:
    ax1 = fig.add_subplot(3, 1, 1)
    ax2, ax3 = fig.add_subplot(3, 1, 2, sharex=ax1), fig.add_subplot(3, 1, 3, sharex=ax1)
    for p in dict.fromkeys(df.planner):
        d = df[(df.planner == p) & (df.metric == "step_s")]
        ax1.plot(d.time_s, 1e3 * d.value, ".", ms=2, label=label(p))
    qos_line(ax1)
    ax1.set_ylabel("TPOT (ms)")
    ax1.set_ylim(0, 1500)
    legend(ax1, markerscale=4)
    v = df[df.planner == "voltron"]
    for k, lab in (("n_fp16", "FP16"), ("n_int8", "INT8"), ("n_int4", "INT4"), ("n_tp", "run as TP")):
        ax2.plot(*gapped(v[v.metric == k]), lw=0.9, label=lab)
    ax2.set_ylabel("sublayers (Voltron)")
    legend(ax2)
    ax3.plot(*gapped(v[v.metric == "accuracy"]), lw=0.9, color="tab:green")
    ax3.set_ylabel("accuracy proxy\n(Voltron)")
    ax3.set_xlabel("time (s)")
    note(fig, "simulated")
