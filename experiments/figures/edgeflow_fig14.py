"""Counterpart of EdgeFlow's evaluation: TTFT against EdgeFlow's average bit budget (4-8 bits), with the
baselines (whose weight formats follow the papers' set-ups whatever the budget) for reference, Llama3-8B, MMLU
prompt length, simulated. The paper's evaluation figures are withheld from the design text."""
from __future__ import annotations

import pandas as pd

from experiments.figures.base import FigureSpec, fig_legend, note
from experiments.figures.data import sweep_frame
from experiments.figures.names import label

GRID = {"full": ((4.0, 5.0, 6.0, 7.0, 8.0), ("mmlu",)), "toy": ((4.0, 6.0), ("lambada",))}
FRAMEWORKS = ("llamacpp", "mnn", "llmnpu_plus", "edgeflow")

SPEC = FigureSpec(
    name="edgeflow_fig14", paper="EdgeFlow", figure="", withheld=True,
    topic="Cold-start TTFT and bytes read vs EdgeFlow's bit budget",
    title="Llama3-8B, Xiaomi 15 Pro profile; baselines at their fixed formats",
    claim="The bit budget trades accuracy for cold-start latency: fewer bits per weight mean fewer bytes to read "
          "from flash, so EdgeFlow's TTFT falls with the budget while the INT8 baselines do not move.",
    simulated="cold starts at each budget (EdgeFlow allocation; baselines at their fixed formats)",
    tolerances={"value": (1e-4, 1e-9)})


def data(size: str) -> pd.DataFrame:
    bits, wls = GRID[size]
    return pd.DataFrame(sweep_frame(("llama3_8b",), FRAMEWORKS, wls, bits=bits, keys=("ttft_s", "flash_bytes")))


def plot(df: pd.DataFrame, fig) -> None:
    ax1, ax2 = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    for fw in FRAMEWORKS:
        d = df[(df.framework == fw) & (df.metric == "ttft_s")]
        ax1.plot(d.bits, d.value, "o-", label=label(fw))
        d = df[(df.framework == fw) & (df.metric == "flash_bytes")]
        ax2.plot(d.bits, d.value / 1e9, "o-", label=label(fw))
    ax1.set_xlabel("EdgeFlow bit budget (bits per weight)")
    ax1.set_ylabel(f"TTFT (s), {label(df.workload.iloc[0])} prompt ({df.prompt_tokens.iloc[0]} tokens)")
    ax2.set_xlabel("EdgeFlow bit budget (bits per weight)")
    ax2.set_ylabel("bytes read from flash (GB)")
    fig_legend(fig, (ax1, ax2))
    note(fig, "simulated")
