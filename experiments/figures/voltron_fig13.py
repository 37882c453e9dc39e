"""Counterpart of Voltron's evaluation: energy mode (§4.4) and planning overhead — energy per generated token
and TPOT with and without spending the QoS slack on lower DVFS levels, per cluster (simulated), and the time one
re-plan takes on this host (measured: the planner runs for real here). The paper's evaluation figures are withheld
from the design text."""
from __future__ import annotations

import pandas as pd

from experiments.figures.base import FigureSpec, fig_legend, note
from experiments.figures.names import label, labels
from experiments.figures.voltron_data import conversation, qos_line, summary

GRID = {"full": dict(clusters=("car", "office", "home"), model="qwen2_5_7b", turns=3),
        "toy": dict(clusters=("office",), model="qwen2_5_3b", turns=1)}
TRACE = "steady_strong"

SPEC = FigureSpec(
    name="voltron_fig13", paper="Voltron", figure="", withheld=True,
    topic="Energy mode and re-planning cost",
    title="energy per token and TPOT with and without energy mode, steady strong link; re-plan time on this host",
    claim="When QoS leaves slack, Voltron runs devices at lower frequency to save energy while staying within the "
          "TPOT target; re-planning is cheap enough to run before every token.",
    simulated="energy per token (device power model) and TPOT with energy mode off / on",
    measured="re-plan time of the planner on this host (median ms; a wall-clock time, changes run to run)",
    tolerances={"value": (1e-4, 1e-9)}, measured_columns=("plan_ms_p50",))


def data(size: str) -> pd.DataFrame:
    g = GRID[size]
    rows = []
    for cl in g["clusters"]:
        for variant, on in (("voltron", False), ("voltron + energy mode", True)):
            res = conversation(cl, g["model"], "voltron", TRACE, g["turns"], energy_mode=on)
            s = summary(res, ("energy_mj_per_token", "tpot_ms_p50", "qos_tpot_violation_rate", "accuracy_proxy"))
            plan_ms = res.metrics.get("plan_ms_p50")
            rows += [{"cluster": cl, "model": g["model"], "variant": variant, "metric": k, "value": v,
                      "plan_ms_p50": float("nan") if plan_ms is None else float(plan_ms), "source": "modelled"}
                     for k, v in s.items()]
    return pd.DataFrame(rows)


def plot(df: pd.DataFrame, fig) -> None:
    clusters = list(dict.fromkeys(df.cluster))
    axes = []
    for i, (k, lab) in enumerate((("energy_mj_per_token", "energy per token (mJ)"), ("tpot_ms_p50", "TPOT p50 (ms)"))):
        ax = fig.add_subplot(1, 3, i + 1)
        axes.append(ax)
        for j, v in enumerate(dict.fromkeys(df.variant)):
            d = df[(df.metric == k) & (df.variant == v)].set_index("cluster")
            ax.bar([c + 0.4 * j for c in range(len(clusters))], [d.value.get(c) for c in clusters], 0.4,
                   label=label(v))
        ax.set_xticks([c + 0.2 for c in range(len(clusters))], labels(clusters))
        ax.set_ylabel(lab)
        ax.set_title(f"{lab.split(' (')[0]} (simulated)", fontsize=9)
        if k == "tpot_ms_p50":
            qos_line(ax)
    ax = fig.add_subplot(1, 3, 3)
    d = df.drop_duplicates(["cluster", "variant"])
    ax.bar(range(len(d)), d.plan_ms_p50, color="tab:gray")
    ax.set_xticks(range(len(d)), [f"{label(c)}\n{'energy mode' if 'energy' in v else 'Voltron'}"
                                  for c, v in zip(d.cluster, d.variant)], fontsize=7)
    ax.set_ylabel("re-plan time, median (ms)")
    ax.set_title("re-plan time (measured on this host)", fontsize=9)
    fig_legend(fig, axes)
    note(fig, f"model {label(df.model.iloc[0])}")
