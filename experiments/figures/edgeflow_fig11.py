"""Counterpart of EdgeFlow's evaluation: cold-start TTFT of the frameworks on the four evaluated models
(Llama3-8B, Mistral-7B, Phi3-3.8B, Qwen1.5-1.8B; exact shapes from their public configs), one prompt length,
Xiaomi 15 Pro profile, simulated. The paper's evaluation figures are withheld from the design text."""
from __future__ import annotations

import pandas as pd

from experiments.figures.base import FigureSpec, legend, note
from experiments.figures.data import grouped_bars, sweep_frame
from experiments.figures.names import label
from sim.coldstart.sweep import MAIN_FRAMEWORKS

GRID = {"full": (("llama3_8b", "mistral_7b", "phi3_3_8b", "qwen1_5_1_8b"), MAIN_FRAMEWORKS, ("mmlu",)),
        "toy": (("qwen1_5_1_8b",), ("llamacpp", "edgeflow"), ("lambada",))}

SPEC = FigureSpec(
    name="edgeflow_fig11", paper="EdgeFlow", figure="", withheld=True,
    topic="Cold-start TTFT per model and framework",
    title="MMLU's median prompt length, Xiaomi 15 Pro profile, EdgeFlow at 5 bits",
    claim="EdgeFlow's advantage holds across model sizes and architectures: the larger the weights on flash, the "
          "more the adaptive bits and the load/compute overlap save.",
    simulated="each framework's cold start of each model at one prompt length",
    tolerances={"value": (1e-4, 1e-9)})


def data(size: str) -> pd.DataFrame:
    models, fws, wls = GRID[size]
    return pd.DataFrame(sweep_frame(models, fws, wls, keys=("ttft_s",)))


def plot(df: pd.DataFrame, fig) -> None:
    ax = fig.add_subplot(1, 1, 1)
    grouped_bars(ax, df, "model", "framework", log=True)
    ax.set_ylabel(f"TTFT (s, log), {label(df.workload.iloc[0])} prompt ({df.prompt_tokens.iloc[0]} tokens)")
    legend(ax)
    note(fig, "simulated")
