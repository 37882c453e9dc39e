"""Counterpart of Voltron's evaluation: ablation of Voltron's run-time mechanisms (Office cluster), each switched off
on a trace that needs it — the closed loop (model corrections and the p99 margin), overlapped shard reloads and KV
pruning on the walk-away trace with a disconnect; communication scaling on `weak_link` (the tablet's link at 3 % of
its goodput); compute pruning on `compute_squeeze` (the main device at 45 % speed); simulated. The paper's evaluation
figures are withheld from the design text."""
from __future__ import annotations

import pandas as pd

from experiments.figures.base import FigureSpec, fig_legend, note
from experiments.figures.names import labels
from experiments.figures.voltron_data import QOS_TPOT_MS, conversation, qos_line, summary
from sim.multidevice.report import ABLATION as CASES  # (trace, turns, think s, variants): the results page's cases

GRID = {"full": dict(model="qwen2_5_14b", cases=CASES),
        "toy": dict(model="qwen2_5_3b", cases=(("walk_away_disconnect", 1, None, CASES[0][3][:2]),))}
CLUSTER = "office"

SPEC = FigureSpec(
    name="voltron_fig11", paper="Voltron", figure="", withheld=True,
    topic="Ablation of Voltron's run-time mechanisms",
    title="Office cluster, each mechanism switched off on the trace that needs it",
    claim="Each elastic mechanism matters when conditions change: correcting the latency model from measured steps, "
          "scaling what goes over a weak link, pruning when compute alone breaks the TPOT target, and hiding "
          "reloads behind compute keep QoS with a small accuracy cost.",
    simulated="Voltron with one mechanism switched off at a time, on the trace built to need it",
    tolerances={"value": (1e-4, 1e-9)})


def data(size: str) -> pd.DataFrame:
    g = GRID[size]
    rows = []
    for trace, turns, think_s, variants in g["cases"]:
        for label, kw in variants:
            s = summary(conversation(CLUSTER, g["model"], "voltron", trace, turns, think_s=think_s, **kw))
            rows += [{"trace": trace, "variant": label, "model": g["model"], "metric": k, "value": v,
                      "source": "modelled"} for k, v in s.items()]
    return pd.DataFrame(rows)


def plot(df: pd.DataFrame, fig) -> None:
    keys = (("qos_tpot_violation_rate", f"share of tokens over the TPOT target ({QOS_TPOT_MS:g} ms)"),
            ("tpot_ms_p99", "TPOT p99 (ms)"), ("accuracy_proxy", "accuracy proxy (MMLU points)"))
    for i, (k, lab) in enumerate(keys):
        ax = fig.add_subplot(1, 3, i + 1)
        d = df[df.metric == k]
        full = (d.variant == "voltron").to_numpy()
        ax.bar(range(len(d)), d.value, color=["tab:blue" if f else "tab:orange" for f in full])
        ax.set_xticks(range(len(d)), [f"{v} ({t})" for v, t in zip(labels(d.variant), labels(d.trace))], rotation=45,
                      ha="right", fontsize=6)
        ax.set_title(lab, fontsize=9)
        if k == "tpot_ms_p99":
            qos_line(ax)
    fig_legend(fig, fig.axes)
    note(fig, "simulated")
