"""EdgeFlow Fig. 1 (§2.2): breakdown of llm.npu's cold start — online graph build, materialized graph, materialized
graph with per-layer overlap — simulated on the calibrated Xiaomi 15 Pro profile beside the paper's component figures
(`sim.coldstart.calibration`: the profile is fitted to these components; the overlapped run is a pure check)."""
from __future__ import annotations

import pandas as pd

from experiments.figures.base import FigureSpec, legend, note
from experiments.figures.data import device, model
from experiments.figures.names import label
from sim.coldstart.calibration import LLMNPU_TOKENS, TARGETS, llmnpu_run

SPEC = FigureSpec(
    name="edgeflow_fig01", paper="EdgeFlow", figure="Fig. 1", topic="llm.npu cold-start breakdown",
    title=f"Llama3-8B, {LLMNPU_TOKENS}-token prompt, Xiaomi 15 Pro profile",
    claim="Building the NPU graph online makes llm.npu's cold start take tens of seconds; storing the optimized graph "
          "and overlapping per-layer graph loading with prefill removes most of it, but weight loading stays on the "
          "critical path and leaves a long bubble, so the cold start is still above what users tolerate.",
    simulated="the three llm.npu variants on the calibrated phone profile (set-up, load, graph, execute, TTFT)",
    tolerances={"seconds": (1e-5, 1e-9)})

VARIANTS = (("llmnpu", "online (Fig. 1a)"), ("llmnpu_mat", "materialized (Fig. 1b)"),
            ("llmnpu_plus", "materialized + overlap (Fig. 1c)"))
PHASES = ("setup_s", "load_s", "graph_s", "prefill_s", "ttft_s")
PAPER = {("llmnpu", "ttft_s"): TARGETS["llmnpu_online_ttft"], ("llmnpu", "load_s"): TARGETS["llmnpu_load_weights"],
         ("llmnpu", "prefill_s"): TARGETS["llmnpu_execute"],
         ("llmnpu_mat", "ttft_s"): TARGETS["llmnpu_materialized_ttft"],
         ("llmnpu_mat", "load_s"): TARGETS["llmnpu_load_graph"],
         ("llmnpu_plus", "ttft_s"): TARGETS["llmnpu_overlap_ttft"]}


def data(size: str) -> pd.DataFrame:
    spec, dev = model("llama3_8b"), device()          # cheap at any size (< 1 s): toy = full
    rows = []
    for policy, name in VARIANTS:
        m = llmnpu_run(spec, dev, policy)
        for ph in PHASES:
            rows.append({"variant": policy, "label": name, "phase": ph, "seconds": m[ph], "source": "modelled"})
            if (policy, ph) in PAPER:
                rows.append({"variant": policy, "label": name, "phase": ph, "seconds": PAPER[(policy, ph)],
                             "source": "paper"})
    return pd.DataFrame(rows)


def plot(df: pd.DataFrame, fig) -> None:
    ax = fig.add_subplot(1, 1, 1)
    mod = df[df.source == "modelled"]
    labels = [lab for _, lab in VARIANTS]
    colors = {"setup_s": "0.6", "load_s": "tab:blue", "graph_s": "tab:orange", "prefill_s": "tab:green"}
    for i, (policy, _lab) in enumerate(VARIANTS):
        d = mod[mod.variant == policy].set_index("phase")["seconds"]
        if policy == "llmnpu_plus":        # overlapped: phases run concurrently; show the end-to-end bar only
            ax.barh(i, d["ttft_s"], color="tab:purple", label="TTFT (overlapped phases)")
            continue
        left = 0.0
        for ph in ("setup_s", "load_s", "graph_s", "prefill_s"):
            ax.barh(i, d[ph], left=left, color=colors[ph], label=label(ph) if i == 0 else None)
            left += d[ph]
    pap = df[(df.source == "paper") & (df.phase == "ttft_s")]
    for i, (policy, _lab) in enumerate(VARIANTS):
        v = pap[pap.variant == policy]["seconds"]
        if len(v):
            ax.plot([float(v.iloc[0])] * 2, [i - 0.4, i + 0.4], "k--", lw=1.2,
                    label="paper TTFT" if i == 0 else None)
    ax.set_yticks(range(len(labels)), labels)
    ax.set_xlabel("seconds (bars: modelled; dashed: paper)")
    legend(ax)
    note(fig, "simulated on the calibrated phone profile")
