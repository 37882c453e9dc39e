"""Voltron Fig. 2 (§2.2): what single-device techniques give — each model of the three families (smaller models,
quantized) run alone on the strongest device of the Office cluster: accuracy proxy, TTFT and TPOT against the QoS
targets, or OOM; simulated conversations (`planner.voltron` single-device baseline, best uniform precision)."""
from __future__ import annotations

import pandas as pd

from experiments.figures.base import FigureSpec, fig_legend, note
from experiments.figures.names import label
from experiments.figures.voltron_data import BASE_MMLU, FAMILIES, QOS_TTFT_S, conversation, qos_line, summary

GRID = {"full": dict(families=tuple(FAMILIES), turns=3), "toy": dict(families=("qwen2_5",), turns=1)}
CLUSTER, TRACE = "office", "steady_strong"

SPEC = FigureSpec(
    name="voltron_fig02", paper="Voltron", figure="Fig. 2",
    topic="Single-device execution: accuracy vs TTFT and TPOT",
    title="smaller and quantized models alone on the strongest Office device, best uniform precision that fits "
          "(the paper's pruning points are not modelled)",
    claim="On one edge device, small or heavily quantized models meet the latency targets only with low accuracy, "
          "and the accurate models either miss the TTFT/TPOT targets or do not fit in memory.",
    simulated="a conversation of each model on the single strongest device (best uniform precision that fits)",
    tolerances={"value": (1e-4, 1e-9)})


def data(size: str) -> pd.DataFrame:
    g = GRID[size]
    rows = []
    for fam in g["families"]:
        models = sorted(FAMILIES[fam], key=lambda m: BASE_MMLU[m])
        if size == "toy":
            models = models[:1]
        for m in models:
            res = conversation(CLUSTER, m, "single", TRACE, g["turns"])
            s = summary(res)
            rows += [{"family": fam, "model": m, "precision": res.metrics.get("precision") or "none",
                      "metric": k, "value": v, "source": "modelled"} for k, v in s.items()]
    return pd.DataFrame(rows)


def plot(df: pd.DataFrame, fig) -> None:
    ax1, ax2 = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    piv = df.pivot(index=["family", "model", "precision"], columns="metric", values="value").reset_index()
    for fam in dict.fromkeys(piv.family):
        d = piv[piv.family == fam]
        ax1.plot(d.ttft_s, d.accuracy_proxy, "o", label=label(fam))
        ax2.plot(d.tpot_ms_p50, d.accuracy_proxy, "o", label=label(fam))
        for _, r in d.iterrows():
            lab = f"{label(r.model)} {label(r.precision)}" + (" OOM" if r.oom else "")
            for ax, x in ((ax1, r.ttft_s), (ax2, r.tpot_ms_p50)):
                ax.annotate(lab, (x, r.accuracy_proxy), xytext=(3, 3), textcoords="offset points", fontsize=6)
    qos_line(ax1, QOS_TTFT_S, "TTFT", vertical=True)
    qos_line(ax2, vertical=True)
    ax1.set_xlabel("TTFT mean (s)")
    ax2.set_xlabel("TPOT p50 (ms)")
    ax1.set_ylabel("accuracy proxy (MMLU points)")
    for ax in (ax1, ax2):
        ax.margins(x=0.25, y=0.15)             # room for the model labels inside the axes
    fig_legend(fig, (ax1, ax2))
    note(fig, "simulated")
    unfit = piv[piv.ttft_s.isna() & piv.tpot_ms_p50.isna()]
    if len(unfit):
        note(fig, "no precision fits (not drawn): " + ", ".join(label(m) for m in unfit.model))
