"""Counterpart of EdgeFlow's evaluation: ablation — TTFT as EdgeFlow's techniques are added one by one
(adaptive bits in the INT4/INT8 mixed format -> + weightlet packing -> + granular pipeline -> + fine placement ->
+ position priority -> + CPU stealing = EdgeFlow), against llm.npu+ (materialized + overlap), per prompt length,
simulated. The paper's evaluation figures are withheld from the design text."""
from __future__ import annotations

import pandas as pd

from experiments.figures.base import FigureSpec, legend, note
from experiments.figures.data import grouped_bars, sweep_frame
from experiments.figures.names import label
from sim.coldstart.sweep import WORKLOADS

STEPS = ("llmnpu_plus", "ef_mixed", "ef_pack", "ef_pipe", "ef_place", "ef_priority", "edgeflow")
GRID = {"full": (STEPS, WORKLOADS), "toy": (("llmnpu_plus", "ef_mixed", "ef_pack", "edgeflow"), ("lambada",))}

SPEC = FigureSpec(
    name="edgeflow_fig13", paper="EdgeFlow", figure="", withheld=True,
    topic="Cold-start ablation: TTFT as EdgeFlow's techniques are added",
    title="Llama3-8B, Xiaomi 15 Pro profile, 5 bits, each dataset's median prompt length",
    claim="Each technique helps only where the bound it removes is on the critical path (edgeflow_critical_path "
          "shows the paths). At short prompts the cold start is flash-bound: adaptive bits and weightlet packing "
          "cut the bytes read (packing trades part of the flash time for unpack time), and the granular pipeline "
          "takes flash off the critical path, leaving the graph thread's restores as the bound, which no later step "
          "touches. At long prompts NPU compute bounds the prefill from the first step, so bits and packing "
          "hardly move the TTFT, while fine placement and position priority cut it. CPU task stealing gains "
          "nothing up to MMLU length and makes HellaSwag about 8 % slower: a stolen INT8 matmul takes about 10x "
          "its NPU time on the CPU, and the CPU becomes the bound.",
    simulated="the ablation policies (one policy file each under sim/coldstart/) at each dataset's prompt length",
    tolerances={"value": (1e-4, 1e-9)})


def data(size: str) -> pd.DataFrame:
    fws, wls = GRID[size]
    return pd.DataFrame(sweep_frame(("llama3_8b",), fws, wls, keys=("ttft_s",)))


def plot(df: pd.DataFrame, fig) -> None:
    ax = fig.add_subplot(1, 1, 1)
    d = df.copy()
    d["group"] = [f"{label(w)}\n({t} tokens)" for w, t in zip(d.workload, d.prompt_tokens)]
    grouped_bars(ax, d, "group", "framework")
    ax.set_ylabel("TTFT (s)")
    legend(ax, title="technique added")
    note(fig, "simulated")
