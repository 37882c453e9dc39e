"""`python -m experiments.figures figure=<name>|all|index size=full|toy out=figures progress=true workers=0
missing=run|skip`.

Thin Hydra app: resolves the figure names, writes each figure's CSV / PNG / PDF through `experiments.figures.base`
and the index page; a tqdm bar with an ETA over the figures unless `progress=false`. Figures are independent, so
`workers` processes build them in parallel (0: one per core); within a process, figures share every simulation of
the same configuration (`experiments.figures.data.run_coldstart`, `voltron_data.conversation`), so the figures that
share most go to the same worker. The files are those of a serial run: each figure's data depends on its own
configuration only, and every file is written atomically. Errors in the arguments stop
before any work with one line `error: <key>: ...` (exit 2); so does a figure asked for by name whose results are
not on disk. `all` leaves such a figure out and prints why.

A figure drawn from an experiment's runs that the app can start itself (its module defines `missing()` and
`run_missing()`: the real quantization of `edgeflow_fig12_table4`, `python -m experiments.quantize`) is not left
out: with `missing=run` (default) the app prints one line with the runs' modelled duration and the figure's worker
runs the experiment first; with `missing=skip` it is treated like a figure whose results are not on disk.
"""
from __future__ import annotations

import importlib
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from experiments.figures import NAMES, available, load, unavailable
from experiments.figures.base import SIZES, set_progress, write_figure
from experiments.figures.index import write_index

CONF = Path(__file__).resolve().parents[2] / "conf"


@dataclass
class FiguresConfig:
    figure: str = "all"        # a figure module name (experiments/figures/), `all`, or `index` (the index page only)
    size: str = "full"         # full: the paper's setting; toy: seconds (the golden tests' size)
    out: str = "figures"       # output directory (relative to the working directory)
    progress: bool = True      # tqdm progress bar with ETA on stderr
    workers: int = 0           # processes building figures in parallel; 0: one per core; 1: in this process
    missing: str = "run"       # a figure whose experiment runs are not on disk: run (them, then the figure) | skip


ConfigStore.instance().store(name="figures_schema", node=FiguresConfig)


MISSING = ("run", "skip")


def pending(name: str) -> str | None:
    """What experiment runs figure `name` needs that are not on disk (with the commands that make them), or None;
    only figures whose module can run them (`missing()` / `run_missing()`)."""
    check = getattr(importlib.import_module(f"experiments.figures.{name}"), "missing", None)
    return check() if check else None


def left_out(missing: str = "run") -> dict[str, str]:
    """Figures `all` leaves out because the results they need are not on disk: name -> why (with `missing=skip`,
    also those whose experiment the app could run)."""
    return {n: why for n in available() if (why := unavailable(n) or (pending(n) if missing == "skip" else None))}


def resolve(cfg: FiguresConfig) -> list[str]:
    """Figure names to build, after checking every argument (ValueError naming the key); `all` without the
    figures of `left_out`."""
    if cfg.size not in SIZES:
        raise ValueError(f"size: must be one of {', '.join(SIZES)} (got {cfg.size!r})")
    if cfg.missing not in MISSING:
        raise ValueError(f"missing: must be one of {', '.join(MISSING)} (got {cfg.missing!r})")
    names = [n.strip() for n in str(cfg.figure).split(",") if n.strip()]
    if not names:
        raise ValueError("figure: give a figure name, all or index")
    if names == ["all"]:
        skip = left_out(cfg.missing if cfg.size == "full" else "run")
        return [n for n in available() if n not in skip]
    if names == ["index"]:
        return []
    unknown = [n for n in names if n not in NAMES or n not in available()]
    if unknown:
        raise ValueError(f"figure: unknown figure {unknown[0]!r}; one of: all, index, {', '.join(available())}")
    for n in names:
        if why := unavailable(n) or (pending(n) if cfg.missing == "skip" and cfg.size == "full" else None):
            raise ValueError(f"figure: {n}: {why}")
    return names


def validate(cfg: DictConfig) -> None:
    """The pre-check (`experiments.common.precheck`, before Hydra makes a run directory): every argument."""
    from experiments.common import ConfigError, strict_bool

    c = FiguresConfig(**OmegaConf.to_container(cfg, resolve=True))
    strict_bool(c.progress, "progress")
    if isinstance(c.workers, bool) or not isinstance(c.workers, int) or c.workers < 0:
        raise ConfigError(f"workers: a whole number ≥ 0 (0: one per core; got {c.workers!r})")
    if not isinstance(c.out, str) or not c.out.strip():
        raise ConfigError(f"out: an output directory (got {c.out!r})")
    resolve(c)


# Figures that simulate the same configurations (counted with `data.COUNTS` / `voltron_data.COUNTS`): one task
# each, built in one process so the shared runs are simulated once. Every other figure is a task of its own.
SHARED = (("edgeflow_fig02", "edgeflow_fig05", "edgeflow_fig10", "edgeflow_fig11", "edgeflow_fig13",
           "edgeflow_fig14", "edgeflow_fig15", "edgeflow_fig16", "edgeflow_critical_path"),
          ("voltron_fig11", "voltron_fig12"))
# Tasks in decreasing build time (process CPU seconds of each task at size=full, counted with cProfile on this 2-core
# host; docs/figures.md "Cost"), started in this order so the workers end together (longest first); unlisted
# figures take about a second each and follow in the given order. A figure that first runs its missing experiment
# (`run_missing`) starts before all of them.
HEAVY = ("edgeflow_fig02", "edgeflow_sensitivity", "voltron_fig10", "voltron_fig11", "voltron_fig13",
         "voltron_fig03_04", "voltron_fig08", "voltron_fig02", "voltron_fig07")


def tasks(names: list[str], first: tuple[str, ...] = ()) -> list[list[str]]:
    """`names` in groups built in one process each (`SHARED`): those holding a figure of `first`, then the `HEAVY`
    ones longest first, then the rest in the given order."""
    groups, seen = [], set()
    for n in names:
        if n in seen:
            continue
        group = next(([m for m in g if m in names] for g in SHARED if n in g), [n])
        seen.update(group)
        groups.append(group)

    def rank(g: list[str]) -> tuple[bool, int]:
        return not any(n in first for n in g), min((HEAVY.index(n) for n in g if n in HEAVY), default=len(HEAVY))

    return sorted(groups, key=rank)


def _build_group(group: list[str], size: str, out: Path, progress: bool, runs: tuple[str, ...] = ()) -> list[dict]:
    """Write the figures of one task (in a worker process, or in this one); one summary row per figure. The figures
    in `runs` first run their missing experiment runs (`run_missing`; counted in their wall time)."""
    from experiments.figures import data, voltron_data

    set_progress(progress)
    rows = []
    for name in group:
        t0 = time.perf_counter()
        if name in runs:
            importlib.import_module(f"experiments.figures.{name}").run_missing()
        before = {k: data.COUNTS[k] + voltron_data.COUNTS[k] for k in data.COUNTS}
        paths = write_figure(load(name), size, out)
        runs = {k: data.COUNTS[k] + voltron_data.COUNTS[k] - before[k] for k in before}
        rows.append({"figure": name, "wall_s": time.perf_counter() - t0, **runs,
                     **{k: str(v) for k, v in paths.items()}})
    return rows


def build(names: list[str], size: str, out: Path, progress: bool = True, workers: int = 1,
          runs: tuple[str, ...] = ()) -> list[dict]:
    """Write every figure in `names` and the index with `workers` processes (0: one per core, 1: this process),
    the figures in `runs` after running their missing experiment runs; returns one summary row per figure, in the
    order of `names` (name, seconds, simulations run / reused, files)."""
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from multiprocessing import get_context

    from tqdm import tqdm

    groups = tasks(names, runs)
    workers = min(workers or os.cpu_count() or 1, len(groups)) or 1
    set_progress(progress)
    bar = tqdm(total=len(names), desc="figures", unit="fig", disable=not progress, file=sys.stderr)
    rows = []
    try:
        if workers == 1:
            for group in groups:
                bar.set_postfix_str(",".join(group))
                rows += _build_group(group, size, out, progress, runs)
                bar.update(len(group))
        else:           # spawn: a clean interpreter per worker (no forked matplotlib / thread state)
            with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
                futures = {pool.submit(_build_group, g, size, out, False, runs): g for g in groups}
                for f in as_completed(futures):
                    rows += f.result()
                    bar.set_postfix_str(",".join(futures[f]))
                    bar.update(len(futures[f]))
    finally:
        bar.close()
    write_index(out)
    order = {n: i for i, n in enumerate(names)}
    return sorted(rows, key=lambda r: order[r["figure"]])


def run(cfg: DictConfig) -> list[dict]:
    c = FiguresConfig(**OmegaConf.to_container(cfg, resolve=True))
    try:
        names = resolve(c)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    out = Path(c.out)
    if c.figure == "all":
        for n, why in left_out(c.missing if c.size == "full" else "run").items():
            print(f"{n}: left out: {why}", file=sys.stderr)
    runs = tuple(n for n in names if c.size == "full" and pending(n))
    for n in runs:
        mod = importlib.import_module(f"experiments.figures.{n}")
        print(f"{n}: {pending(n)}: running them first, about {mod.estimate_s() / 60:.0f} min "
              f"(modelled; missing=skip leaves the figure out)", file=sys.stderr)
    rows = build(names, c.size, out, c.progress, c.workers, runs)
    for r in rows:
        print(f"{r['figure']:24s} {r['wall_s']:7.1f} s (measured)  simulations {r['simulated']:3d} run, "
              f"{r['reused']:3d} reused  {r['png']}")
    print(f"index: {out / 'index.md'}")
    return rows


@hydra.main(config_path=str(CONF), config_name="figures", version_base="1.3")
def main(cfg: DictConfig) -> None:
    run(cfg)
