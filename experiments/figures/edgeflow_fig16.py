"""EdgeFlow evaluation counterpart "Fig. 16": the pipeline-scheduling steps — CPU and NPU bubble rates of the prefill
pipeline for the static coarse schedule (llm.npu materialized), EdgeFlow's pipeline with each scheduling refinement
(fine placement, position priority, CPU task stealing) — per prompt length, Llama3-8B, simulated; with the stolen
operator count. The paper's evaluation figures are withheld from the design text."""
from __future__ import annotations

import pandas as pd

from experiments.figures.base import FigureSpec, note
from experiments.figures.data import grouped_bars, sweep_frame
from sim.coldstart.sweep import WORKLOADS

STEPS = ("llmnpu_mat", "ef_pipe", "ef_place", "ef_priority", "edgeflow")
GRID = {"full": (STEPS, WORKLOADS), "toy": (("llmnpu_mat", "ef_priority", "edgeflow"), ("lambada",))}

SPEC = FigureSpec(
    name="edgeflow_fig16", paper="EdgeFlow", figure="Fig. 16", withheld=True,
    title="CPU / NPU bubble rates of the prefill pipeline per scheduling step, Llama3-8B, 5 bits",
    claim="Operator-granular placement, position-guided priority and CPU task stealing each shrink the idle time "
          "of the CPU and NPU pipeline that a coarse static schedule leaves.",
    simulated="prefill pipeline of each scheduling step (bubble rate = 1 - busy / prefill time), stolen operators",
    tolerances={"value": (1e-4, 1e-9)})


def data(size: str) -> pd.DataFrame:
    fws, wls = GRID[size]
    return pd.DataFrame(sweep_frame(("llama3_8b",), fws, wls,
                                    keys=("cpu_bubble_rate", "npu_bubble_rate", "stolen_ops", "prefill_s")))


def plot(df: pd.DataFrame, fig) -> None:
    for i, k in enumerate(("cpu_bubble_rate", "npu_bubble_rate")):
        ax = fig.add_subplot(1, 2, i + 1)
        d = df[df.metric == k].copy()
        d["value"] = 100 * d["value"].astype(float)
        grouped_bars(ax, d, "workload", "framework")
        ax.set_ylabel(f"{k[:3].upper()} bubble rate (%)")
        if i == 0:
            ax.legend(fontsize=8)
            note(ax, "simulated")
