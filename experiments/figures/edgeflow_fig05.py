"""EdgeFlow Fig. 5c (§3.2, Challenge 3): CPU and NPU busy time and bubble rate of llm.npu's coarse, static CPU/NPU
pipeline across prompt lengths (Llama3-8B, materialized graph), simulated; EdgeFlow's granular pipeline beside it.
Panel 5a (the per-subgraph timeline) is the Perfetto trace of `python -m experiments.coldstart framework=llmnpu_mat`;
panel 5b (RMSNorm / SwiGLU / quantize on NPU vs CPU) is an input of the profile (`npu_inefficient_factor` = 2.1x,
Fig. 5b) and is not re-plotted."""
from __future__ import annotations

import pandas as pd

from experiments.figures.base import FigureSpec, fig_legend, note
from experiments.figures.data import coldstart
from experiments.figures.names import label

TOKENS = {"full": (64, 128, 256, 512, 1024), "toy": (128, 256)}
FRAMEWORKS = ("llmnpu_mat", "edgeflow")
KEYS = ("prefill_s", "cpu_busy_s", "npu_busy_s", "cpu_bubble_rate", "npu_bubble_rate")
PAPER_MAX_BUBBLE = 0.91      # Fig. 5c: up to 91 % bubble rate

SPEC = FigureSpec(
    name="edgeflow_fig05", paper="EdgeFlow", figure="Fig. 5c",
    topic="CPU / NPU busy time and bubble rate of llm.npu's static prefill pipeline",
    title="Llama3-8B, 5 bits, Xiaomi 15 Pro profile; EdgeFlow's pipeline beside it",
    claim="llm.npu's coarse, static split puts NPU-inefficient operators on the NPU, so the NPU is always the longer "
          "side and the pipeline idles most of the time (bubble rates up to about 90 %), and the imbalance shifts "
          "with prompt length, which a static schedule cannot follow.",
    simulated="prefill of llm.npu (materialized graph) and EdgeFlow at 64-1024 prompt tokens",
    tolerances={"value": (1e-4, 1e-9)})


def data(size: str) -> pd.DataFrame:
    rows = []
    for fw in FRAMEWORKS:
        for n in TOKENS[size]:
            m = coldstart("llama3_8b", fw, prompt_tokens=n, bits=5.0)
            rows += [{"framework": fw, "prompt_tokens": n, "metric": k, "value": m[k], "source": "modelled"}
                     for k in KEYS]
    rows.append({"framework": "llmnpu_mat", "prompt_tokens": 0, "metric": "max_bubble_rate",
                 "value": PAPER_MAX_BUBBLE, "source": "paper"})
    return pd.DataFrame(rows)


def plot(df: pd.DataFrame, fig) -> None:
    ax1, ax2 = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    mod = df[df.source == "modelled"]
    for fw, style in (("llmnpu_mat", "-"), ("edgeflow", "--")):
        for k, c in (("cpu_busy_s", "tab:blue"), ("npu_busy_s", "tab:orange")):
            d = mod[(mod.framework == fw) & (mod.metric == k)]
            ax1.plot(d.prompt_tokens, d.value, style, color=c, marker="o", label=f"{label(fw)}, {k[:3].upper()}")
        for k, c in (("cpu_bubble_rate", "tab:blue"), ("npu_bubble_rate", "tab:orange")):
            d = mod[(mod.framework == fw) & (mod.metric == k)]
            ax2.plot(d.prompt_tokens, 100 * d.value, style, color=c, marker="o", label=f"{label(fw)}, {k[:3].upper()}")
    p = df[(df.source == "paper")]
    ax2.axhline(100 * float(p.value.iloc[0]), color="k", ls=":", lw=1, label="paper: up to 91 % (llm.npu)")
    ax1.set_xlabel("prompt tokens")
    ax1.set_ylabel("busy time in prefill (s)")
    ax1.set_title("busy time", fontsize=9)
    ax2.set_xlabel("prompt tokens")
    ax2.set_ylabel("bubble rate (%)")
    ax2.set_title("bubble rate", fontsize=9)
    fig_legend(fig, (ax1, ax2), ncol=5)
    note(fig, "simulated")
