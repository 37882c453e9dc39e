"""Counterpart of EdgeFlow's evaluation: the pipeline-scheduling steps — CPU and NPU bubble rates of the prefill
pipeline for the static coarse schedule (llm.npu materialized), EdgeFlow's pipeline with each scheduling refinement
(fine placement, position priority, CPU task stealing) — per prompt length, Llama3-8B, simulated; with the stolen
operator count. The paper's evaluation figures are withheld from the design text."""
from __future__ import annotations

import pandas as pd

from experiments.figures.base import FigureSpec, fig_legend, note
from experiments.figures.data import grouped_bars, sweep_frame
from sim.coldstart.sweep import WORKLOADS

STEPS = ("llmnpu_mat", "ef_pipe", "ef_place", "ef_priority", "edgeflow")
GRID = {"full": (STEPS, WORKLOADS), "toy": (("llmnpu_mat", "ef_priority", "edgeflow"), ("lambada",))}

SPEC = FigureSpec(
    name="edgeflow_fig16", paper="EdgeFlow", figure="", withheld=True,
    topic="Prefill pipeline bubbles per scheduling step",
    title="CPU / NPU bubble rates, Llama3-8B, Xiaomi 15 Pro profile, 5 bits",
    claim="Operator-granular placement, position-guided priority and CPU task stealing each shrink the idle time "
          "of the CPU and NPU pipeline that a coarse static schedule leaves.",
    simulated="prefill pipeline of each scheduling step (bubble rate = 1 - busy / prefill time), stolen operators",
    tolerances={"value": (1e-4, 1e-9)})


def data(size: str) -> pd.DataFrame:
    fws, wls = GRID[size]
    return pd.DataFrame(sweep_frame(("llama3_8b",), fws, wls,
                                    keys=("cpu_bubble_rate", "npu_bubble_rate", "stolen_ops", "prefill_s")))


def plot(df: pd.DataFrame, fig) -> None:
    axes = []
    for i, k in enumerate(("cpu_bubble_rate", "npu_bubble_rate")):
        ax = fig.add_subplot(1, 2, i + 1)
        d = df[df.metric == k].copy()
        d["value"] = 100 * d["value"].astype(float)
        grouped_bars(ax, d, "workload", "framework")
        ax.set_ylabel(f"{k[:3].upper()} bubble rate (%)")
        axes.append(ax)
    fig_legend(fig, axes)
    note(fig, "simulated")
