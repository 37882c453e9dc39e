"""Shared data helpers of the figure modules: typed configs by name, in-process cold-start runs (one simulation per
configuration per process: `figure=all` shares them between figures) and measured results found on disk. Library
functions only (`sim/`, `planner/`, `quant/`); nothing here is fitted or hard-coded."""
from __future__ import annotations

import copy
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


_RUNS: dict[str, dict] = {}      # repr of the typed configuration -> metrics of its one simulated cold start
COUNTS = {"simulated": 0, "reused": 0}      # cold starts simulated / answered from `_RUNS` in this process


def run_coldstart(spec: ModelSpec, dev: SocProfile, fw: FrameworkSpec, wl: WorkloadSpec | None,
                  settings: ColdStartSettings) -> dict:
    """The modelled metrics of `sim.coldstart.run.run_one` for this configuration, simulated once per process and
    keyed by the full typed configuration (every field of the dataclasses' repr), so figures asking for the same
    cold start share it; the simulation is deterministic, so a reused result equals a re-run. Returns a copy."""
    key = repr((spec, dev, fw, wl, settings))
    if key in _RUNS:
        COUNTS["reused"] += 1
    else:
        COUNTS["simulated"] += 1
        _RUNS[key] = run_one(spec, dev, fw, wl, settings)[0]
    return copy.deepcopy(_RUNS[key])


def coldstart(model_name: str, fw: str, wl: str | None = None, dev: str = PHONE, **settings: Any) -> dict:
    """One simulated cold start (modelled metrics of `sim.coldstart.run.run_one`), no trace."""
    return run_coldstart(model(model_name), device(dev), framework(fw), workload(wl) if wl else None,
                         ColdStartSettings(write_trace=False, **settings))


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
    """Long rows (model, framework, workload, prompt_tokens, bits, metric, value, source=modelled) of the cold starts
    of `sim.coldstart.sweep.sweep` over the grid, each through `run_coldstart` (shared between figures)."""
    from experiments.figures.base import progress

    rows = []
    keys = tuple(keys)
    for m, fw in progress([(m, fw) for m in models for fw in frameworks], "cold starts"):
        spec, d, f = model(m), device(dev), framework(fw)
        runs = (run_coldstart(spec, d, f, workload(w), ColdStartSettings(bits=b, write_trace=False))
                for w in workloads for b in bits)
        for r in runs:
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
