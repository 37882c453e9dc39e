"""Counterpart of EdgeFlow's evaluation: energy and peak memory of the cold start per framework (Llama3-8B,
Xiaomi 15 Pro profile, 5 bits), simulated from the profile's power model and the memory each plan holds. The
paper's evaluation figures are withheld from the design text."""
from __future__ import annotations

import pandas as pd

from experiments.figures.base import FigureSpec, fig_legend, note
from experiments.figures.data import grouped_bars, sweep_frame
from sim.coldstart.sweep import MAIN_FRAMEWORKS

GRID = {"full": (MAIN_FRAMEWORKS, ("lambada", "mmlu", "hellaswag")), "toy": (("mnn", "edgeflow"), ("lambada",))}

SPEC = FigureSpec(
    name="edgeflow_fig15", paper="EdgeFlow", figure="", withheld=True,
    topic="Cold-start energy and peak memory per framework",
    title="Llama3-8B, Xiaomi 15 Pro profile, EdgeFlow at 5 bits, per dataset's median prompt length",
    claim="A shorter cold start that reads fewer bytes and keeps cores busy instead of waiting also costs less "
          "energy, and EdgeFlow needs no memory reserved for prefetched weights.",
    simulated="energy (J, profile power model) and peak memory (GB) of each framework's cold start",
    tolerances={"value": (1e-4, 1e-9)})


def data(size: str) -> pd.DataFrame:
    fws, wls = GRID[size]
    return pd.DataFrame(sweep_frame(("llama3_8b",), fws, wls, keys=("energy_j", "peak_mem_gb")))


def plot(df: pd.DataFrame, fig) -> None:
    axes = []
    for i, (k, lab) in enumerate((("energy_j", "energy (J)"), ("peak_mem_gb", "peak memory (GB)"))):
        ax = fig.add_subplot(1, 2, i + 1)
        d = df[df.metric == k]
        grouped_bars(ax, d, "workload", "framework")
        ax.set_ylabel(lab)
        axes.append(ax)
    fig_legend(fig, axes)
    note(fig, "simulated")
