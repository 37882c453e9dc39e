"""Voltron evaluation counterpart "Fig. 10": each planner (Voltron, single device, heterogeneity-aware MP and TP) on
each cluster (Car, Office, Home) and model family runs the most accurate model with which it meets QoS (else the
largest it can run), over the `walk_away` RSSI trace: accuracy proxy, TTFT, TPOT and QoS violations, simulated —
`sim.multidevice.report.table`, the README's multi-device table. The paper's evaluation figures are withheld from
the design text. `toy`: Office, the Qwen2.5 family's smallest model, one turn, every planner."""
from __future__ import annotations

import pandas as pd

from experiments.figures.base import FigureSpec, note
from experiments.figures.voltron_data import BASE_MMLU, FAMILIES, KEYS, conversation, summary

TRACE, TURNS = "walk_away", 3
PLANNERS = ("voltron", "single", "mp", "tp")

SPEC = FigureSpec(
    name="voltron_fig10", paper="Voltron", figure="Fig. 10", withheld=True,
    title="accuracy and QoS per cluster, family and planner (best model meeting QoS), trace walk_away",
    claim="By choosing MP or TP per layer and phase, mixing precisions by layer importance and adapting at run "
          "time, Voltron runs larger, more accurate models within the TTFT/TPOT targets than a single device or "
          "a fixed MP / TP split on every cluster.",
    simulated="conversations of every planner x cluster x model family under one RSSI trace",
    measured="",
    tolerances={"value": (1e-4, 1e-9)})


def data(size: str) -> pd.DataFrame:
    rows = []
    if size == "full":
        from sim.multidevice.report import table

        for r in table(TRACE, TURNS, progress=False):
            base = {"cluster": r["cluster"], "family": r["family"], "planner": r["planner"], "model": r["model"]}
            for k in KEYS:
                v = r.get(k)
                rows.append({**base, "metric": k, "value": float("nan") if v is None else float(v)})
            rows.append({**base, "metric": "oom", "value": float(bool(r["oom"]))})
    else:
        m = min(FAMILIES["qwen2_5"], key=lambda x: BASE_MMLU[x])
        for p in PLANNERS:
            s = summary(conversation("office", m, p, TRACE, 1))
            rows += [{"cluster": "office", "family": "qwen2_5", "planner": p, "model": m, "metric": k, "value": v}
                     for k, v in s.items()]
    df = pd.DataFrame(rows)
    df["source"] = "modelled"
    return df


def plot(df: pd.DataFrame, fig) -> None:
    piv = df.pivot(index=["cluster", "family", "planner", "model"], columns="metric", values="value").reset_index()
    clusters = list(dict.fromkeys(piv.cluster))
    for i, cl in enumerate(clusters):
        ax = fig.add_subplot(1, len(clusters), i + 1)
        d = piv[piv.cluster == cl]
        fams = list(dict.fromkeys(d.family))
        pls = list(dict.fromkeys(d.planner))
        w = 0.8 / len(pls)
        for j, p in enumerate(pls):
            e = d[d.planner == p].set_index("family")
            ax.bar([k + j * w for k in range(len(fams))], [e.accuracy_proxy.get(f, float("nan")) for f in fams], w,
                   label=p)
            for k, f in enumerate(fams):
                if f in e.index and (e.oom[f] or e.qos_tpot_violation_rate[f] > 0.05):
                    ax.text(k + j * w, 1, "x", ha="center", color="r", fontsize=9)
        ax.set_xticks([k + 0.4 - w / 2 for k in range(len(fams))], fams, fontsize=8)
        ax.set_title(cl, fontsize=9)
        if i == 0:
            ax.set_ylabel("accuracy proxy of the model run (MMLU pts)")
            ax.legend(fontsize=7)
            note(ax, "simulated; x: QoS missed / OOM")
