"""Not a paper figure: the critical path of each framework's cold start, stacked by the resource that bounds it
(`planner.critical_path`; docs/coldstart.md "Critical path"), per phase (load window: before the first prefill op;
prefill window: the rest) and prompt length, Llama3-8B, 5 bits, simulated. Read it beside the end-to-end,
ablation, bit-budget, memory and scheduling counterparts (EdgeFlow §3's bottleneck analysis): a TTFT that does not
move with a change is bound by a resource the change does not touch.

Also the shared helpers of those figures: `attribution_rows` (a run's attribution as long CSV rows) and `stacked`
(one stacked bar per run, one colour per resource in every figure)."""
from __future__ import annotations

from typing import Iterable

import pandas as pd

from experiments.figures.base import FigureSpec, fig_legend, note, progress
from experiments.figures.data import coldstart
from experiments.figures.names import label
from planner.critical_path import CATEGORIES

# llm.npu's 45 s of graph preparation (edgeflow_fig01 breaks it down) would flatten every other bar: left out
FRAMEWORKS = ("llamacpp", "mnn", "llmnpu_plus", "ef_mixed", "ef_pack", "ef_pipe", "ef_place", "ef_priority",
              "edgeflow")
GRID = {"full": (FRAMEWORKS, ("lambada", "mmlu", "hellaswag")),
        "toy": (("llamacpp", "llmnpu_plus", "edgeflow"), ("lambada",))}
PHASES = ("load", "prefill")
# hues apart from the first five of tab10, which the figures' framework bars use (grouped_bars, line plots)
COLORS = {"flash": "tab:cyan", "unpack": "tab:olive", "sharing": "tab:brown", "npu": "tab:pink", "cpu": "0.3",
          "graph": "#e6ab02", "idle": "0.8"}

SPEC = FigureSpec(
    name="edgeflow_critical_path", paper="EdgeFlow", figure="",
    topic="Cold-start critical path: the resource that bounds each phase",
    title="Llama3-8B, Xiaomi 15 Pro profile, 5 bits, per dataset's median prompt length",
    claim="(no claim of the paper) The framework's own reading of every cold start: flash bounds llm.npu+'s "
          "cold start (its reads run on through the prefill window), MNN's loading and llama.cpp's short prompts "
          "(llama.cpp pages its weights in during the prefill); the CPU bounds the CPU frameworks from MMLU length "
          "on. EdgeFlow's pipeline takes flash off the critical path: the graph thread's restores bound it up to "
          "MMLU length, NPU and CPU compute at HellaSwag's.",
    simulated="every framework's cold start, its critical path walked back from the LM head and each second "
              "attributed to flash, unpack, core / DRAM waits, NPU, CPU, graph restore or idle",
    tolerances={"seconds": (1e-4, 1e-9), "share": (1e-4, 1e-6)})


def attribution_rows(run: dict, phases: Iterable[str] = PHASES) -> list[dict]:
    """Long rows (phase, resource, seconds, share, bound) of one run's `critical_path` metrics, every category of
    every phase (zeros too: the CSV's rows do not depend on the numbers)."""
    rows = []
    for p in phases:
        a = run["critical_path"][p]
        for c in CATEGORIES:
            rows.append({"phase": p, "resource": c, "seconds": a["seconds"][c], "share": a["share"][c],
                         "bound": a["bound"]})
    return rows


def path_frame(frameworks: Iterable[str], workloads: Iterable[str], bits: Iterable[float] = (5.0,),
               phase: str = "total") -> list[dict]:
    """Long rows in `data.sweep_frame`'s shape (metric `critical_path.<resource>_s`, value in s) of the cold starts'
    critical path in `phase`, Llama3-8B; the runs are those `sweep_frame` simulates (shared in a process)."""
    rows = []
    for fw in frameworks:
        for w in workloads:
            for b in bits:
                r = coldstart("llama3_8b", fw, w, bits=b)
                rows += [{"model": "llama3_8b", "framework": fw, "workload": r["workload"],
                          "prompt_tokens": r["prompt_tokens"], "bits": b, "metric": f"critical_path.{a['resource']}_s",
                          "value": a["seconds"], "source": "modelled"} for a in attribution_rows(r, (phase,))]
    return rows


def path_of(df: pd.DataFrame) -> pd.DataFrame:
    """The `path_frame` rows of a figure's long data, with a `resource` column (`stacked` draws them)."""
    cp = df[df.metric.str.startswith("critical_path.")].copy()
    cp["resource"] = cp.metric.str.slice(len("critical_path."), -len("_s"))
    return cp


def data(size: str) -> pd.DataFrame:
    fws, wls = GRID[size]
    rows = []
    for fw, w in progress([(f, w) for w in wls for f in fws], "cold starts"):
        r = coldstart("llama3_8b", fw, w)
        for a in attribution_rows(r):
            rows.append({"framework": fw, "workload": w, "prompt_tokens": r["prompt_tokens"], **a,
                         "source": "modelled"})
    return pd.DataFrame(rows)


def stacked(ax, df: pd.DataFrame, bar: str, value: str = "seconds", rotate: bool = True) -> None:
    """One stacked bar per distinct `bar` (order of first appearance) of `value` per `resource`; resources in
    `CATEGORIES` order, coloured alike in every figure."""
    bars = list(dict.fromkeys(df[bar]))
    cell = {(b, c): v for b, c, v in zip(df[bar], df["resource"], df[value])}
    bottom = [0.0] * len(bars)
    for c in CATEGORIES:
        h = [float(cell.get((b, c), 0.0)) for b in bars]
        if any(v > 0 for v in h):
            ax.bar(range(len(bars)), h, 0.7, bottom=bottom, label=label(c), color=COLORS[c])
            bottom = [b + v for b, v in zip(bottom, h)]
    ax.set_xticks(range(len(bars)), [label(b) for b in bars], rotation=90 if rotate else 0, fontsize=7)


def path_legend(axes, anchor_ax, **kw) -> None:
    """One legend of the resources drawn in any of `axes`, right of `anchor_ax` (outside the axes)."""
    seen: dict[str, object] = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(lab, h)
    order = [label(c) for c in CATEGORIES if label(c) in seen]
    kw = {"fontsize": 7, "loc": "upper left", "bbox_to_anchor": (1.02, 1.0), "title": "critical path in",
          "title_fontsize": 7, **kw}
    anchor_ax.legend([seen[o] for o in order], order, **kw)


def path_row(fig, gs, row: int, df: pd.DataFrame, workloads, ylabel: str, share_y: bool = False,
             rotate: bool = True) -> None:
    """Under a figure's panels: one critical-path panel per workload (two columns of grid `gs` each) in its `row`,
    a bar per framework stacked by resource, and one legend of the resources."""
    cp, paths = path_of(df), []
    for j, w in enumerate(workloads):
        ax = fig.add_subplot(gs[row, 2 * j:2 * j + 2], sharey=paths[0] if share_y and paths else None)
        stacked(ax, cp[cp.workload == w], "framework", value="value", rotate=rotate)
        ax.set_title(label(w), fontsize=8)
        ax.tick_params(axis="x", labelsize=6)
        if j == 0:
            ax.set_ylabel(ylabel, fontsize=8)
        paths.append(ax)
    path_legend(paths, paths[-1])


def plot(df: pd.DataFrame, fig) -> None:
    wls = list(dict.fromkeys(df.workload))
    axes = []
    for i, p in enumerate(PHASES):
        for j, w in enumerate(wls):
            ax = fig.add_subplot(len(PHASES), len(wls), i * len(wls) + j + 1,
                                 sharey=axes[i * len(wls)] if j else None)
            d = df[(df.workload == w) & (df.phase == p)]
            stacked(ax, d, "framework", rotate=True)
            ax.tick_params(axis="x", labelbottom=i == len(PHASES) - 1)
            if j == 0:
                ax.set_ylabel(f"{label(p)} window (s)")
            if i == 0:
                ax.set_title(f"{label(w)} ({d.prompt_tokens.iloc[0]} tokens)", fontsize=9)
            axes.append(ax)
    fig_legend(fig, axes, ncol=len(CATEGORIES))
    note(fig, "simulated; critical path walked back from the LM head")
