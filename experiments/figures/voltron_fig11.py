"""Counterpart of Voltron's evaluation: ablation of Voltron's run-time mechanisms over the walk-away trace with
a disconnect (Office cluster): full Voltron vs without communication scaling (activation quantization / pruning),
without compute pruning, without overlapped shard reloads, and with KV recompute instead of pruning on a
disconnect; simulated. The paper's evaluation figures are withheld from the design text."""
from __future__ import annotations

import pandas as pd

from experiments.figures.base import FigureSpec, fig_legend, note
from experiments.figures.names import labels
from experiments.figures.voltron_data import QOS_TPOT_MS, conversation, qos_line, summary

VARIANTS = (("voltron", {}), ("no comm scaling", {"comm_scaling": False}),
            ("no compute pruning", {"compute_pruning": False}), ("no reload overlap", {"overlap_reload": False}),
            ("KV recompute on disconnect", {"disconnect_kv": "recompute"}))
GRID = {"full": dict(model="qwen2_5_14b", turns=5, think_s=60.0, variants=VARIANTS),
        "toy": dict(model="qwen2_5_3b", turns=1, think_s=None, variants=VARIANTS[:2])}
CLUSTER, TRACE = "office", "walk_away_disconnect"

SPEC = FigureSpec(
    name="voltron_fig11", paper="Voltron", figure="", withheld=True,
    topic="Ablation of Voltron's run-time mechanisms",
    title="Office cluster, walk-away trace with a disconnect",
    claim="Each elastic mechanism matters when conditions change: scaling what goes over a weak link, pruning when "
          "compute alone breaks the TPOT target, and hiding reloads behind compute keep QoS with a small "
          "accuracy cost.",
    simulated="Voltron with one mechanism switched off at a time over the same conversation and trace",
    tolerances={"value": (1e-4, 1e-9)})


def data(size: str) -> pd.DataFrame:
    g = GRID[size]
    rows = []
    for label, kw in g["variants"]:
        s = summary(conversation(CLUSTER, g["model"], "voltron", TRACE, g["turns"], think_s=g["think_s"], **kw))
        rows += [{"variant": label, "model": g["model"], "metric": k, "value": v, "source": "modelled"}
                 for k, v in s.items()]
    return pd.DataFrame(rows)


def plot(df: pd.DataFrame, fig) -> None:
    keys = (("qos_tpot_violation_rate", f"share of tokens over the TPOT target ({QOS_TPOT_MS:g} ms)"),
            ("tpot_ms_p99", "TPOT p99 (ms)"), ("accuracy_proxy", "accuracy proxy (MMLU points)"))
    for i, (k, lab) in enumerate(keys):
        ax = fig.add_subplot(1, 3, i + 1)
        d = df[df.metric == k]
        ax.bar(range(len(d)), d.value, color="tab:blue")
        ax.set_xticks(range(len(d)), labels(d.variant), rotation=45, ha="right", fontsize=7)
        ax.set_title(lab, fontsize=9)
        if k == "tpot_ms_p99":
            qos_line(ax)
    fig_legend(fig, fig.axes)
    note(fig, "simulated")
