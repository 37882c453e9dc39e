"""EdgeFlow Fig. 4 (§3.2, Challenge 2): (a) the per-channel bit-width distribution of Llama3-8B under the adaptive
5-bit allocation (quantizer twin, `planner.formats.model_bits`) and (b) loading (2 threads, layer by layer) and
unpacking (1 thread) times of three packings — raw INT8, INT4/INT8 mixed and K-quant — plus EdgeFlow's weightlet
format, simulated (`sim.coldstart.calibration.fig4b`), beside the paper's numbers."""
from __future__ import annotations

import numpy as np
import pandas as pd

from experiments.figures.base import FigureSpec, fig_legend, note
from experiments.figures.data import device, model
from experiments.figures.names import labels
from planner.formats import model_bits
from sim.coldstart.calibration import FIG4B_BUDGET, TARGETS, fig4b

PAPER_SHARES = {4: 0.115, 5: 0.777, 6: 0.099, 7: 0.008, 8: 0.0004}      # Fig. 4a, fraction of channels
PAPER_TIMES = {("int8", "load_s"): TARGETS["fig4b_load_int8"], ("mixed", "load_s"): TARGETS["fig4b_load_mixed"],
               ("kquant", "load_s"): TARGETS["fig4b_load_kquant"],
               ("kquant", "unpack_s"): TARGETS["fig4b_unpack_kquant"]}
FORMATS = ("int8", "mixed", "kquant", "weightlet")
MODELS = {"full": "llama3_8b", "toy": "llama3_8b"}   # < 1 s with the cached allocation: toy = full

SPEC = FigureSpec(
    name="edgeflow_fig04", paper="EdgeFlow", figure="Fig. 4",
    topic="Adaptive bit widths and the load / unpack cost of packing them",
    title="Llama3-8B, 5-bit budget, Xiaomi 15 Pro profile",
    claim="Adaptive allocation puts most channels at the budget with a spread around it; packing such odd widths "
          "either pads (INT4/INT8 mixed: little saving in load time) or compacts them (K-quant: fast load, but slow "
          "unpacking that becomes the new bottleneck).",
    simulated="the twin's allocation (a) and the layer-by-layer load / unpack of each format (b)",
    tolerances={"value": (1e-4, 1e-9)})


def data(size: str) -> pd.DataFrame:
    spec, dev = model(MODELS[size]), device()
    bits, _ = model_bits(spec, FIG4B_BUDGET, 0)
    rows = []
    allb = np.concatenate([np.asarray(b).ravel() for b in bits.values()])
    for w in range(1, 9):
        rows.append({"panel": "a", "item": f"{w} bits", "metric": "channel_share", "value": float(np.mean(allb == w)),
                     "source": "modelled"})
        if w in PAPER_SHARES:
            rows.append({"panel": "a", "item": f"{w} bits", "metric": "channel_share", "value": PAPER_SHARES[w],
                         "source": "paper"})
    for fmt in FORMATS:
        m = fig4b(spec, dev, None if fmt == "int8" else bits, fmt)
        for k in ("load_s", "unpack_s"):
            rows.append({"panel": "b", "item": fmt, "metric": k, "value": m[k], "source": "modelled"})
            if (fmt, k) in PAPER_TIMES:
                rows.append({"panel": "b", "item": fmt, "metric": k, "value": PAPER_TIMES[(fmt, k)],
                             "source": "paper"})
    return pd.DataFrame(rows)


def plot(df: pd.DataFrame, fig) -> None:
    ax1, ax2 = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    a = df[df.panel == "a"]
    items = list(dict.fromkeys(a.item))
    for off, src, color in ((-0.2, "modelled", "tab:blue"), (0.2, "paper", "0.6")):
        d = a[a.source == src].set_index("item")["value"]
        ax1.bar([i + off for i in range(len(items))], [100 * d.get(it, 0.0) for it in items], 0.4, color=color,
                label=f"channel share, {src}")
    ax1.set_xticks(range(len(items)), [it.split()[0] for it in items])
    ax1.set_xlabel("bits per weight (channel)")
    ax1.set_ylabel("% of output channels")
    ax1.set_title("(a) 5-bit adaptive allocation", fontsize=9)
    b = df[df.panel == "b"]
    for i, fmt in enumerate(FORMATS):
        d = b[(b.item == fmt) & (b.source == "modelled")].set_index("metric")["value"]
        ax2.bar(i - 0.2, d["load_s"], 0.4, color="tab:blue", label="load (2 threads)" if i == 0 else None)
        ax2.bar(i + 0.2, d["unpack_s"], 0.4, color="tab:orange", label="unpack (1 thread)" if i == 0 else None)
        p = b[(b.item == fmt) & (b.source == "paper")].set_index("metric")["value"]
        for k, off in (("load_s", -0.2), ("unpack_s", 0.2)):
            if k in p:
                ax2.plot([i + off - 0.2, i + off + 0.2], [p[k]] * 2, "k--", lw=1.2,
                         label="paper" if (i, k) == (0, "load_s") else None)
    ax2.set_xticks(range(len(FORMATS)), labels(FORMATS), fontsize=8)
    ax2.set_ylabel("seconds")
    ax2.set_title("(b) load and unpack, 32 layers", fontsize=9)
    fig_legend(fig, (ax1, ax2), ncol=5)
    note(fig, "bars: modelled; grey bars and dashed lines: the paper")
