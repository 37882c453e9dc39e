"""Shared data helpers of the figure modules: typed configs by name, in-process cold-start runs, measured results
found on disk. Library functions only (`sim/`, `planner/`, `quant/`); nothing here is fitted or hard-coded."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

from planner.device import SocProfile
from planner.framework import FrameworkSpec
from planner.workload import WorkloadSpec
from quant.arch import ModelSpec
from sim.coldstart.run import ColdStartSettings, run_one
from sim.coldstart.sweep import load_conf

ROOT = Path(__file__).resolve().parents[2]
PHONE = "xiaomi15pro"          # EdgeFlow testbed profile (docs/coldstart.md)


def model(name: str) -> ModelSpec:
    return load_conf("model", name, ModelSpec)


def device(name: str = PHONE) -> SocProfile:
    return load_conf("device", name, SocProfile)


def framework(name: str) -> FrameworkSpec:
    return load_conf("framework", name, FrameworkSpec)


def workload(name: str) -> WorkloadSpec:
    return load_conf("workload", name, WorkloadSpec)


def coldstart(model_name: str, fw: str, wl: str | None = None, dev: str = PHONE, **settings: Any) -> dict:
    """One simulated cold start (modelled metrics of `sim.coldstart.run.run_one`), no trace."""
    return run_one(model(model_name), device(dev), framework(fw), workload(wl) if wl else None,
                   ColdStartSettings(write_trace=False, **settings))[0]


def metrics_files(roots: Iterable[Path]) -> list[tuple[Path, dict]]:
    """(path, metrics) of every readable metrics.json under `roots` (missing roots are skipped), sorted by path."""
    out = []
    for root in roots:
        root = Path(root)
        if not root.is_dir():
            continue
        for p in sorted(root.rglob("metrics.json")):
            try:
                out.append((p, json.loads(p.read_text())))
            except (OSError, ValueError):
                continue
    return out


def sweep_frame(models: Iterable[str], frameworks: Iterable[str], workloads: Iterable[str],
                bits: Iterable[float] = (5.0,), keys: Iterable[str] = ("ttft_s",), dev: str = PHONE) -> list[dict]:
    """Long rows (model, framework, workload, prompt_tokens, bits, metric, value, source=modelled) of
    `sim.coldstart.sweep.sweep` over the grid."""
    from experiments.figures.base import progress
    from sim.coldstart.sweep import sweep

    rows = []
    keys = tuple(keys)
    for m, fw in progress([(m, fw) for m in models for fw in frameworks], "cold starts"):
        for r in sweep(model=m, device=dev, frameworks=(fw,), workloads=tuple(workloads), bits=tuple(bits)):
            for k in keys:
                rows.append({"model": m, "framework": r["framework"], "workload": r["workload"],
                             "prompt_tokens": r["prompt_tokens"], "bits": r["bits"], "metric": k, "value": r[k],
                             "source": "modelled"})
    return rows


def grouped_bars(ax, df, group: str, series: str, value: str = "value", log: bool = False) -> None:
    """Bars of `value`: one group per distinct `group`, one bar per `series` (order of first appearance), both shown
    by their display names (`experiments.figures.names`)."""
    from matplotlib import colormaps
    from matplotlib.ticker import FuncFormatter

    from experiments.figures.names import label

    groups = list(dict.fromkeys(df[group]))
    sers = list(dict.fromkeys(df[series]))
    cell = {(g, s): v for g, s, v in zip(df[group], df[series], df[value])}
    width = 0.8 / max(1, len(sers))
    colors = colormaps["tab10" if len(sers) <= 10 else "tab20"].colors    # paired shades only when needed
    for i, s in enumerate(sers):
        ax.bar([j + i * width for j in range(len(groups))],
               [cell.get((g, s), float("nan")) for g in groups], width, label=label(s), color=colors[i % len(colors)])
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(groups))], [label(g) for g in groups])
    if log:
        ax.set_yscale("log")
        plain = FuncFormatter(lambda v, _pos: f"{v:g}")       # 2, 3, 5, 10 … instead of 2×10⁰
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(plain)
