"""Voltron Fig. 4 (§3.2.1-3.2.2): decode TPOT broken into computation and communication for MP and TP on the
heterogeneous clusters, with the naive equal split the characterisation uses (Fig. 4) and the heterogeneity-aware
split, plus Voltron; simulated conversations (`sim.multidevice.runner`; the equal-split table of
`sim.multidevice.report.equal_split` is the same runs over three families). Fig. 3's homogeneous cluster is not a
configured cluster: its MP-vs-TP contrast shows here on the heterogeneous ones."""
from __future__ import annotations

import pandas as pd

from experiments.figures.base import FigureSpec, fig_legend, note
from experiments.figures.names import label, labels
from experiments.figures.voltron_data import conversation, qos_line

GRID = {"full": dict(clusters=("car", "office", "home"), model="gemma3_12b", turns=2),
        "toy": dict(clusters=("office",), model="qwen2_5_3b", turns=1)}
RUNS = (("mp", "equal"), ("tp", "equal"), ("mp", "hetero"), ("tp", "hetero"), ("voltron", "hetero"))
TRACE = "steady_strong"

SPEC = FigureSpec(
    name="voltron_fig03_04", paper="Voltron", figure="Fig. 4",
    topic="Decode TPOT breakdown of MP and TP on heterogeneous clusters",
    title="computation + communication, equal and heterogeneity-aware splits, and Voltron",
    claim="MP computes sequentially with little traffic while TP computes in parallel but communicates every layer; "
          "on heterogeneous clusters an even split makes the weakest device the bottleneck or runs it out of "
          "memory, so neither method fits all cases.",
    simulated="decode steps of each planner on each cluster (mean step, its communication part, OOM)",
    tolerances={"value": (1e-4, 1e-9)})


def data(size: str) -> pd.DataFrame:
    g = GRID[size]
    rows = []
    for cl in g["clusters"]:
        for planner, balance in RUNS:
            res = conversation(cl, g["model"], planner, TRACE, g["turns"], balance=balance)
            tl = pd.DataFrame(res.timeline)
            dec = tl[tl.phase == "decode"] if len(tl) else tl
            step = 1e3 * float(dec.step_s.mean()) if len(dec) else float("nan")
            comm = 1e3 * float(dec.comm_s.mean()) if len(dec) else float("nan")
            label = f"{planner}-{balance}" if planner != "voltron" else "voltron"
            for k, v in (("tpot_ms", step), ("comm_ms", comm), ("compute_ms", step - comm),
                         ("oom", float(bool(res.metrics["oom"])))):
                rows.append({"cluster": cl, "model": g["model"], "planner": label, "metric": k, "value": v,
                             "source": "modelled"})
    return pd.DataFrame(rows)


def plot(df: pd.DataFrame, fig) -> None:
    clusters = list(dict.fromkeys(df.cluster))
    axes = []
    for i, cl in enumerate(clusters):
        ax = fig.add_subplot(1, len(clusters), i + 1)
        axes.append(ax)
        d = df[df.cluster == cl]
        pls = list(dict.fromkeys(d.planner))
        cell = {(p, k): v for p, k, v in zip(d.planner, d.metric, d.value)}
        comp = [cell[(p, "compute_ms")] for p in pls]
        comm = [cell[(p, "comm_ms")] for p in pls]
        ax.bar(range(len(pls)), comp, color="tab:blue", label="computation")
        ax.bar(range(len(pls)), comm, bottom=comp, color="tab:orange", label="communication")
        for j, p in enumerate(pls):
            if cell[(p, "oom")]:
                ax.text(j, 0, "OOM", ha="center", va="bottom", color="r", fontsize=8)
        qos_line(ax)
        ax.set_xticks(range(len(pls)), labels(pls), rotation=30, ha="right", fontsize=7)
        ax.set_title(f"{label(cl)}, {label(d.model.iloc[0])}", fontsize=9)
        if i == 0:
            ax.set_ylabel("decode TPOT, mean (ms)")
    fig_legend(fig, axes)
    note(fig, "simulated; OOM: the plan does not fit")
