"""Counterpart of Voltron's evaluation: each planner (Voltron, single device, heterogeneity-aware MP and TP) on
each cluster (Car, Office, Home) and model family runs the most accurate model with which it meets QoS (else the
largest it can run), over the `walk_away` RSSI trace: accuracy proxy, TTFT, TPOT and QoS violations, simulated —
`sim.multidevice.report.table`, the README's multi-device table. The paper's evaluation figures are withheld from
the design text. `toy`: Office, the Qwen2.5 family's smallest model, one turn, every planner."""
from __future__ import annotations

import pandas as pd

from experiments.figures.base import FigureSpec, note
from experiments.figures.names import label, labels
from experiments.figures.voltron_data import BASE_MMLU, FAMILIES, KEYS, QOS_TPOT_MS, conversation, summary

TRACE, TURNS = "walk_away", 3
MISS_SHARE = 0.05          # share of tokens over the TPOT target above which a run counts as missing QoS (the plot)
PLANNERS = ("voltron", "single", "mp", "tp")

SPEC = FigureSpec(
    name="voltron_fig10", paper="Voltron", figure="", withheld=True,
    topic="Accuracy within QoS per cluster, model family and planner",
    title="the most accurate model each planner runs within QoS (else the largest it can run), walk-away trace",
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
    from matplotlib.patches import Patch

    piv = df.pivot(index=["cluster", "family", "planner", "model"], columns="metric", values="value").reset_index()
    clusters = list(dict.fromkeys(piv.cluster))
    colors = {p: c for p, c in zip(PLANNERS, ("tab:green", "tab:gray", "tab:blue", "tab:orange"))}
    axes = []
    for i, cl in enumerate(clusters):
        ax = fig.add_subplot(1, len(clusters), i + 1, sharey=axes[0] if axes else None)
        axes.append(ax)
        d = piv[piv.cluster == cl]
        fams = list(dict.fromkeys(d.family))
        pls = list(dict.fromkeys(d.planner))
        w = 0.8 / len(pls)
        for j, p in enumerate(pls):
            e = d[d.planner == p].set_index("family")
            for k, f in enumerate(fams):
                if f not in e.index:
                    continue
                miss = bool(e.oom[f]) or float(e.qos_tpot_violation_rate[f]) > MISS_SHARE
                ax.bar(k + j * w, 0 if e.oom[f] else e.accuracy_proxy[f], w, color=colors.get(p, "0.5"),
                       hatch="///" if miss else None, edgecolor="tab:red" if miss else "white", lw=0.8)
                if e.oom[f]:
                    ax.text(k + j * w, 0, "OOM", rotation=90, ha="center", va="bottom", color="tab:red", fontsize=6)
        ax.set_xticks([k + 0.4 - w / 2 for k in range(len(fams))], labels(fams), fontsize=8)
        ax.set_title(label(cl), fontsize=9)
        if i == 0:
            ax.set_ylabel("accuracy proxy of the model run (MMLU points)")
    handles = [Patch(color=colors.get(p, "0.5"), label=label(p)) for p in dict.fromkeys(piv.planner)]
    handles.append(Patch(facecolor="white", edgecolor="tab:red", hatch="///",
                         label=f"misses QoS: > {100 * MISS_SHARE:g} % of tokens over {QOS_TPOT_MS:g} ms, or OOM"))
    fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), fontsize=8)
    note(fig, "simulated")
