"""Counterpart of EdgeFlow's evaluation: ablation — TTFT as EdgeFlow's techniques are added one by one
(adaptive bits in the INT4/INT8 mixed format -> + weightlet packing -> + granular pipeline -> + fine placement ->
+ position priority -> + CPU stealing = EdgeFlow), against llm.npu+ (materialized + overlap), per prompt length,
simulated; each bar is the step's critical path (`planner.critical_path`) stacked by the resource it waits on, so its
height is the TTFT and its colours say which bound the step removed. The paper's evaluation figures are withheld from
the design text."""
from __future__ import annotations

import pandas as pd

from experiments.figures.base import FigureSpec, note
from experiments.figures.data import sweep_frame
from experiments.figures.edgeflow_critical_path import path_frame, path_legend, path_of, stacked
from experiments.figures.names import label
from sim.coldstart.sweep import WORKLOADS

STEPS = ("llmnpu_plus", "ef_mixed", "ef_pack", "ef_pipe", "ef_place", "ef_priority", "edgeflow")
GRID = {"full": (STEPS, WORKLOADS), "toy": (("llmnpu_plus", "ef_mixed", "ef_pack", "edgeflow"), ("lambada",))}

SPEC = FigureSpec(
    name="edgeflow_fig13", paper="EdgeFlow", figure="", withheld=True,
    topic="Cold-start ablation: TTFT as EdgeFlow's techniques are added",
    title="Llama3-8B, Xiaomi 15 Pro profile, 5 bits, each dataset's median prompt length",
    claim="Each technique helps only where the bound it removes is on the critical path (each bar is that path). "
          "Up to MMLU length the cold start is flash-bound at first: adaptive bits and weightlet packing cut the "
          "bytes read (packing trades part of the flash time for unpack time), and the granular pipeline takes "
          "flash off the critical path, leaving the graph thread's restores as the bound (at OBQA length the NPU, "
          "until fine placement), which no later step touches. At HellaSwag length NPU compute bounds the prefill "
          "from the first step, so bits and packing hardly move the TTFT, while fine placement and position "
          "priority cut it. CPU task stealing gains nothing up to MMLU length and makes HellaSwag about 8 % "
          "slower: a stolen INT8 matmul takes about 10x its NPU time on the CPU, and the CPU becomes the bound.",
    simulated="the ablation policies (one policy file each under sim/coldstart/) at each dataset's prompt length",
    tolerances={"value": (1e-4, 1e-9)})


def data(size: str) -> pd.DataFrame:
    fws, wls = GRID[size]
    return pd.DataFrame(sweep_frame(("llama3_8b",), fws, wls, keys=("ttft_s",)) + path_frame(fws, wls))


def plot(df: pd.DataFrame, fig) -> None:
    cp = path_of(df)
    wls = list(dict.fromkeys(cp.workload))
    axes = []
    for j, w in enumerate(wls):
        ax = fig.add_subplot(1, len(wls), j + 1, sharey=axes[0] if axes else None)
        d = cp[cp.workload == w]
        stacked(ax, d, "framework", value="value")
        ax.set_title(f"{label(w)} ({d.prompt_tokens.iloc[0]} tokens)", fontsize=8)
        if j == 0:
            ax.set_ylabel("TTFT (s) = critical path, by resource")
        axes.append(ax)
    path_legend(axes, axes[-1])
    note(fig, "simulated; steps left to right, each adds one technique")
