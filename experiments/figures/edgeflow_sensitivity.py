"""Not a paper figure: how much each value of the phone profile without a phone source moves the simulated TTFT,
per framework and prompt length (`sim.coldstart.sensitivity`, docs/coldstart.md "Assumptions and sensitivity"). Two
kinds of rows: the *assumed* values (no published source; marked `assumed` in conf/device/xiaomi15pro.yaml) and the
modelling assumptions, each at 0.5x and 2x (or the alternative assumption); and llama.cpp's own costs, peer costs
(planner.peer_costs) that a phone has none of because they were *measured on the project's host*, not on a phone: its
fixed part transferred from the host measurement by the clock ratio at 0.5x / 1x / 2x, and a repack rate. Read it
beside the end-to-end figures: a conclusion that flips within these ranges rests on an assumption or a transfer, not
on the calibration. Modelled."""
from __future__ import annotations

import pandas as pd

from experiments.figures.base import FigureSpec, fig_legend, note, progress
from experiments.figures.data import PHONE, device, framework, model, workload
from experiments.figures.names import label
from planner.peer_costs import NO_PEER_COSTS
from sim.coldstart.run import ColdStartSettings, run_one
from sim.coldstart.sensitivity import FRAMEWORKS, WORKLOADS, variants

GRID = {"full": (FRAMEWORKS, WORKLOADS, None), "toy": (("llamacpp", "edgeflow"), ("lambada",), 4)}

SPEC = FigureSpec(
    name="edgeflow_sensitivity", paper="EdgeFlow", figure="",
    topic="Sensitivity of the modelled TTFT to the phone profile's assumed values and transferred host measurements",
    title="each assumed value at 0.5x / 2x (or the alternative assumption); llama.cpp's fixed part measured on the "
          "host, clock-scaled, at 0.5x / 1x / 2x, and a repack rate; Llama3-8B, 5 bits",
    claim="(no claim of the paper) The framework's own check: which modelled TTFTs and which framework orderings "
          "depend on values the component figures do not pin down.",
    simulated="every framework's cold start with each assumed parameter at 0.5x / 2x (or the alternative "
              "assumption), and with llama.cpp's host-measured costs transferred to the phone",
    tolerances={"ttft_s": (1e-4, 1e-9), "change_pct": (1e-3, 1e-6)})


def data(size: str) -> pd.DataFrame:
    fws, wls, n_var = GRID[size]
    spec, dev0 = model("llama3_8b"), device()
    fws0 = {f: framework(f) for f in fws}
    vs = variants(PHONE)[:n_var] if n_var else variants(PHONE)
    rows = []
    for w in wls:
        wl = workload(w)
        base = {f: run_one(spec, dev0, fw, wl, ColdStartSettings(write_trace=False))[0]["ttft_s"]
                for f, fw in fws0.items()}
        for f in fws:
            rows.append({"parameter": "(default)", "variant": "", "workload": w, "framework": f, "ttft_s": base[f],
                         "change_pct": 0.0, "source": "modelled"})
        for key, what, t in progress(vs, f"assumptions ({w})"):
            for f, fw in fws0.items():
                dev, fw2, peers = t(dev0, fw, NO_PEER_COSTS)        # a phone: no peer costs but the variant's
                v = run_one(spec, dev, fw2, wl, ColdStartSettings(write_trace=False), peers)[0]["ttft_s"]
                rows.append({"parameter": key, "variant": what, "workload": w, "framework": f, "ttft_s": v,
                             "change_pct": 100 * (v - base[f]) / base[f], "source": "modelled"})
    return pd.DataFrame(rows)


def plot(df: pd.DataFrame, fig) -> None:
    d = df[df.parameter != "(default)"].copy()
    d["label"] = [f"{label(p)}: {v}" for p, v in zip(d.parameter, d.variant)]
    wls = list(dict.fromkeys(d.workload))
    fws = list(dict.fromkeys(d.framework))
    axes = []
    for i, w in enumerate(wls):
        ax = fig.add_subplot(1, len(wls), i + 1, sharey=axes[0] if axes else None)
        e = d[d.workload == w]
        rows = list(dict.fromkeys(e.label))
        h = 0.8 / len(fws)
        for j, f in enumerate(fws):
            g = e[e.framework == f].set_index("label")["change_pct"]
            ax.barh([k + j * h for k in range(len(rows))], [g.get(lab, 0.0) for lab in rows], h, label=label(f))
        ax.set_yticks([k + 0.4 - h / 2 for k in range(len(rows))], rows, fontsize=6)
        ax.tick_params(axis="y", labelleft=i == 0)
        if i == 0:
            ax.invert_yaxis()                   # the first parameter on top (the axes share y: once for all)
        ax.axvline(0, color="k", lw=0.6)
        ax.set_xlabel(f"TTFT change (%), {label(w)} prompt")
        axes.append(ax)
    fig_legend(fig, axes, ncol=len(fws))
    note(fig, "simulated")
