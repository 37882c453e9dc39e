"""Counterpart of EdgeFlow's evaluation: the pipeline-scheduling steps — CPU and NPU bubble rates of the prefill
pipeline for the static coarse schedule (llm.npu materialized), EdgeFlow's pipeline with each scheduling refinement
(fine placement, position priority, CPU task stealing) — per prompt length, Llama3-8B, simulated; with the stolen
operator count, and each step's critical path in the prefill window (`planner.critical_path`: which resource the
prefill waits on). The paper's evaluation figures are withheld from the design text."""
from __future__ import annotations

import pandas as pd

from experiments.figures.base import FigureSpec, fig_legend, note
from experiments.figures.data import grouped_bars, sweep_frame
from experiments.figures.edgeflow_critical_path import path_frame, path_row
from sim.coldstart.sweep import WORKLOADS

STEPS = ("llmnpu_mat", "ef_pipe", "ef_place", "ef_priority", "edgeflow")
GRID = {"full": (STEPS, WORKLOADS), "toy": (("llmnpu_mat", "ef_priority", "edgeflow"), ("lambada",))}

SPEC = FigureSpec(
    name="edgeflow_fig16", paper="EdgeFlow", figure="", withheld=True,
    topic="Prefill pipeline bubbles per scheduling step",
    title="CPU / NPU bubble rates, Llama3-8B, Xiaomi 15 Pro profile, 5 bits",
    claim="Operator-granular placement moves the non-matmul operators to the CPU: the CPU idles less and the "
          "NPU, with less work, idles more wherever something else bounds the prefill. Position-guided priority "
          "cuts both units' idle time at long prompts. CPU task stealing cuts the CPU's idle time further, but at "
          "HellaSwag length it costs time: a stolen INT8 matmul takes about 10x its NPU time on the CPU, most "
          "stolen operators land on the critical path, and the prefill's bound moves from the NPU to the CPU "
          "(TTFT +8 %). Up to OBQA length the graph thread's restores bound the prefill once placement has taken "
          "the NPU off the path (at OBQA it does), so priority and stealing do not change the TTFT there.",
    simulated="prefill pipeline of each scheduling step (bubble rate = 1 - busy / prefill time), stolen operators",
    tolerances={"value": (1e-4, 1e-9)})


def data(size: str) -> pd.DataFrame:
    fws, wls = GRID[size]
    return pd.DataFrame(sweep_frame(("llama3_8b",), fws, wls,
                                    keys=("cpu_bubble_rate", "npu_bubble_rate", "stolen_ops", "prefill_s", "ttft_s"))
                        + path_frame(fws, wls, phase="prefill"))


def plot(df: pd.DataFrame, fig) -> None:
    wls = list(dict.fromkeys(df.workload))
    gs = fig.add_gridspec(2, 2 * len(wls))
    axes = []
    for i, k in enumerate(("cpu_bubble_rate", "npu_bubble_rate")):
        ax = fig.add_subplot(gs[0, i * len(wls):(i + 1) * len(wls)])
        d = df[df.metric == k].copy()
        d["value"] = 100 * d["value"].astype(float)
        grouped_bars(ax, d, "workload", "framework")
        ax.set_ylabel(f"{k[:3].upper()} bubble rate (%)")
        ax.tick_params(axis="x", labelsize=7)
        axes.append(ax)
    fig_legend(fig, axes)
    path_row(fig, gs, 1, df, wls, "prefill critical path (s)", share_y=True)
    note(fig, "simulated")
